"""Deterministic, real-looking English text for the benchmark inputs (no data set download).

Sentences are put together from hand-written phrases of the kinds an embedding service sees
(support tickets, product reviews, news, documentation, chat): a subject, a verb phrase, an
object, optional place/time phrases and 0..N clauses joined by connectives, plus a list of short
replies. `sentence_pool(n, seed)` gives n sentences of widely spread lengths; `paragraph` joins
sentences into text longer than a 512-token window. The same seed gives the same text on every
machine (random.Random is stable across Python versions for these calls).
"""
import random

SHORT_REPLIES = [
    "I agree.", "Thanks a lot!", "Not really.", "Sounds good to me.", "Why not?",
    "It works now.", "Please advise.", "See attached.", "Great service!", "Never again.",
    "Got it, thanks.", "Still broken.", "Perfect fit.", "Love it!", "Any update?",
    "Same here.", "Well said.", "Too expensive.", "Fixed in 2.3.", "Call me back.",
]

SUBJECTS = [
    "the customer", "our support team", "the new firmware", "my landlord", "the city council",
    "this laptop", "the delivery driver", "a spokesperson for the company", "the research group",
    "the mobile app", "my daughter", "the hotel staff", "the database migration",
    "the central bank", "the orchestra", "the quarterly report", "an independent reviewer",
    "the kitchen team", "the training script", "the museum", "the local football club",
    "the airline", "our neighbour", "the payment service", "the installer", "the senator",
    "the weather service", "the school board", "the pharmacy", "the search engine",
]

VERBS = [
    "announced", "fixed", "rejected", "recommended", "shipped", "cancelled", "described",
    "improved", "questioned", "replaced", "measured", "ignored", "approved", "explained",
    "delayed", "compared", "published", "refunded", "tested", "criticised", "updated",
    "discovered", "scheduled", "summarised", "translated", "reviewed", "installed", "praised",
]

OBJECTS = [
    "the broken charger", "a new pricing plan", "the noise complaint", "the annual budget",
    "a faster checkout page", "the missing package", "the warranty claim", "the exhibition",
    "a detailed error report", "the memory leak", "the late train", "a vegetarian menu",
    "the interest rate decision", "the final chapter", "the contract renewal",
    "the login problem", "a second opinion", "the results of the survey", "the old bridge",
    "a discount for students", "the battery life", "the privacy policy", "the match highlights",
    "the heating system", "a list of open questions", "the tasting menu", "the user manual",
]

PLACES = [
    "in the main office", "at the airport", "on the second floor", "in a short statement",
    "during the live stream", "in the north of the country", "at the weekend market",
    "on the project wiki", "in front of the station", "over the phone", "in the latest release",
    "at the press conference", "in the comments section", "near the old harbour",
]

TIMES = [
    "yesterday", "last Tuesday", "after three weeks", "early this morning", "in March",
    "before the holidays", "within two hours", "at the end of the quarter", "on Friday night",
    "for the third time this year", "shortly after midnight", "ten minutes later",
]

CONNECTIVES = [
    "because", "although", "and then", "but", "so", "while", "even though", "after",
    "which is why", "since", "until", "and as a result",
]

CLAUSES = [
    "nobody had read the instructions", "the screen kept flickering at low brightness",
    "prices went up by four percent", "the first version crashed on start-up",
    "the reviewers asked for more data", "it rained all afternoon",
    "the queue was longer than usual", "the team had already gone home",
    "several users reported the same error", "the package arrived damaged",
    "the numbers did not add up", "the old server ran out of disk space",
    "everyone enjoyed the dessert", "the road was closed for repairs",
    "the documentation was out of date", "the price was lower than expected",
    "the update removed a popular feature", "the audience stood up and applauded",
    "two engineers worked through the night", "the tests passed on the second try",
    "the shop had no stock left", "the agent could not find my order number",
    "the forecast promised sunshine", "the committee wanted a clearer plan",
]

ADJECTIVES = ["surprisingly", "really", "quite", "rather", "very", "slightly", "extremely"]
OPINIONS = ["helpful", "slow", "confusing", "reliable", "disappointing", "clear", "expensive",
            "friendly", "fast", "noisy", "well written", "hard to follow"]


def sentence(rng, clauses):
    """One sentence with `clauses` subordinate clauses (0 gives a plain main clause)."""
    words = [rng.choice(SUBJECTS), rng.choice(VERBS), rng.choice(OBJECTS)]
    if rng.random() < 0.6:
        words.append(rng.choice(PLACES))
    if rng.random() < 0.6:
        words.append(rng.choice(TIMES))
    text = " ".join(words)
    for _ in range(clauses):
        text += (", " if rng.random() < 0.5 else " ") + rng.choice(CONNECTIVES) + " " + \
            rng.choice(CLAUSES)
    if rng.random() < 0.3:
        text += f", and honestly it was {rng.choice(ADJECTIVES)} {rng.choice(OPINIONS)}"
    text = text[0].upper() + text[1:]
    return text + rng.choice([".", ".", ".", ".", "!"])


def sentence_pool(n, seed=2024):
    """n sentences, lengths from a few tokens to well over 128 (short replies included)."""
    rng = random.Random(seed)
    pool = []
    for i in range(n):
        if i % 10 == 0:
            pool.append(rng.choice(SHORT_REPLIES))
        else:
            pool.append(sentence(rng, rng.randint(0, 12)))
    return pool


def paragraph(rng, min_words):
    """Sentences joined until the text has at least `min_words` words."""
    parts, words = [], 0
    while words < min_words:
        s = sentence(rng, rng.randint(1, 4))
        parts.append(s)
        words += len(s.split())
    return " ".join(parts)
