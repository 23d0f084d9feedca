"""What the tests share: answer checks, money checks, settings, Redis clients and set-up fixtures.

Test modules import from here and never from one another or from conftest.
"""
