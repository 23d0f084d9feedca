"""Generated requests against the served OpenAPI document, on fakeredis and a SQLite file
(tests/support/fuzzing.py says what is sent and checked)."""

import pytest

from tests.support.fuzzing import Fuzzing

pytestmark = pytest.mark.slow

_fuzzing = Fuzzing("fake-sqlite")
_app_under_test = _fuzzing.app_fixture()
test_every_operation_answers_as_documented = _fuzzing.operation_test()
test_enough_cases_ran_on_every_operation = _fuzzing.floor_test()
