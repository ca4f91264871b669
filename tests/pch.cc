// Empty: the object libraries that precompile the tests' headers need one source
// (tests/AttnGTest.cmake, attn_test_pch).
