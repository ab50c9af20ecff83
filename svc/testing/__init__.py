"""
Fakes and fixtures shared by the unit tests: in-memory stores, throwaway PKI,
inline workers. Nothing here is used in production code paths.
"""
