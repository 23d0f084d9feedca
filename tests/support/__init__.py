"""What many tests share: HTTP assertions and keys, money checks, settings, fixtures."""
