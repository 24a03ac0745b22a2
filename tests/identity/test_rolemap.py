"""The role map: groups to roles on providers, per identity provider or for all."""

from __future__ import annotations

import pytest

from identity.rolemap import role_map_parse
from identity.roles import grants_of

MAP = """
[groups."ops"]
operator = ["*"]

[groups."leads"]
supervisor = ["orders"]
decide_approvals = ["ledger", "gone"]

[idp.partner.groups."ops"]
viewer = ["ledger"]
"""


def test_a_person_holds_the_union_of_what_their_groups_give() -> None:
    roles = role_map_parse(MAP).roles_of("sso", ["ops", "leads", "unmapped"])
    assert roles == {
        "operator": {"*"},
        "supervisor": {"orders"},
        "decide_approvals": {"ledger", "gone"},
    }


def test_a_group_of_one_identity_provider_adds_to_the_groups_of_all() -> None:
    mapped = role_map_parse(MAP)
    assert mapped.roles_of("partner", ["ops"]) == {"operator": {"*"}, "viewer": {"ledger"}}
    assert mapped.roles_of("sso", ["ops"]) == {"operator": {"*"}}


def test_every_provider_means_those_there_are_and_an_unknown_name_gives_nothing() -> None:
    providers = {"orders": 1, "ledger": 2}
    grants = grants_of({"viewer": {"*"}, "decide_approvals": {"ledger", "gone"}}, providers)
    assert grants == {
        ("view_operations", 1),
        ("view_operations", 2),
        ("decide_approvals", 2),
    }


def test_no_groups_no_roles() -> None:
    assert role_map_parse(MAP).roles_of("sso", []) == {}
    assert role_map_parse("").roles_of("sso", ["ops"]) == {}


@pytest.mark.parametrize("text", ['[groups."x"]\nviewer = []', '[groups."x"]\nviewer = [""]'])
def test_an_empty_list_of_providers_is_a_mistake(text: str) -> None:
    with pytest.raises(Exception, match="not a list of provider names"):
        role_map_parse(text)
