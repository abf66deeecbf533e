"""Small registries that the crash tests run in real worker subprocesses."""
