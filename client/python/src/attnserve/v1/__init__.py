"""attnserve.v1 API messages and stubs, generated from proto/attnserve/v1 when the package is built."""
