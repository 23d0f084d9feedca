"""Generated requests against the served OpenAPI document, on a real Redis server and
PostgreSQL (tests/support/fuzzing.py says what is sent and checked). With the SQLite and
fakeredis file, each Redis and each database is fuzzed once."""

import pytest

from tests.support.fuzzing import Fuzzing

pytestmark = [pytest.mark.slow, pytest.mark.real, pytest.mark.postgres]

_fuzzing = Fuzzing("real-postgresql")
_app_under_test = _fuzzing.app_fixture()
test_every_operation_answers_as_documented = _fuzzing.operation_test()
test_enough_cases_ran_on_every_operation = _fuzzing.floor_test()
