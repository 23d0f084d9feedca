"""Throwaway servers on loopback for the tests and the benchmark (never used by the service)."""
