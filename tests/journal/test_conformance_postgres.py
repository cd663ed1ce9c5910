"""The whole conformance suite against PostgresCheckpointer, two-worker cases included.

Each store the factory hands out is a new, empty journal: a schema of its own in the machine's
database (see ``_pg``); the second handle is a new store (its own pool and lock connection) on
the same schema, as a second worker would open it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import cast

import pytest
from _pg import PG_URL, new_schema, pg_schemas  # noqa: F401 - the fixture

from cuaderno.journal.base import Checkpointer
from cuaderno.journal.postgres import PostgresCheckpointer
from cuaderno.testing.conformance import CASES, Capability, Case, TwoHandles, capabilities, run_conformance

pytestmark = pytest.mark.postgres


def _factory(schemas: list[str]) -> TwoHandles:
    def new() -> Checkpointer:
        schemas.append(new_schema())
        return PostgresCheckpointer(PG_URL, schema=schemas[-1], pool_size=4)

    def second(store: Checkpointer) -> Checkpointer:
        return PostgresCheckpointer(PG_URL, schema=cast(PostgresCheckpointer, store).schema, pool_size=4)

    return TwoHandles(new, second)


@pytest.fixture
def factory(pg_schemas: list[str]) -> Iterator[TwoHandles]:  # noqa: F811
    yield _factory(pg_schemas)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_conformance(case: Case, factory: TwoHandles) -> None:
    assert case.needs <= capabilities(factory)  # every case runs: none is skipped on Postgres
    case.check(factory)


def test_postgres_declares_every_capability(factory: TwoHandles) -> None:
    assert capabilities(factory) == set(Capability)


def test_run_conformance_passes_every_case(factory: TwoHandles) -> None:
    assert run_conformance(factory) == []
