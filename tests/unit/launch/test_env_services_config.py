"""``actors.env_address`` as one address or a list, and the env services' timeouts: composed,
checked, and mapped by launch/config/builders.py onto each actor's ``ActorConfig`` (a list
always, the same slot offset on every service)."""

import dataclasses

import pytest

from actors.config import ActorConfig, env_addresses
from launch.config.builders import actor_config
from launch.config.compose import compose


def test_one_address_or_several_reach_each_actor_as_a_list_with_its_slots_on_each():
    one = compose(["actors.env_address=tcp://h:1", "actors.num=2"])
    several = compose(["actors.env_address=[tcp://h:1,tcp://g:2]", "actors.num=2",
                       "actors.env_timeout_s=5", "actors.env_heartbeat_s=0.5", "actors.env_grace_s=9"])
    assert [actor_config(one, i, "m", "tcp://l:1").env_address for i in (0, 1)] == [["tcp://h:1"]] * 2
    configs = [actor_config(several, i, "m", "tcp://l:1") for i in (0, 1)]
    assert [c.env_address for c in configs] == [["tcp://h:1", "tcp://g:2"]] * 2
    assert [c.env_slot_offset for c in configs] == [0, several.actors.num_slots]
    assert (configs[1].env_timeout_s, configs[1].env_heartbeat_s, configs[1].env_grace_s) == (5.0, 0.5, 9.0)
    local = actor_config(compose([]), 1, "m", "tcp://l:1")
    assert local.env_address == [] and local.env_slot_offset == 0  # the in-process pool


@pytest.mark.parametrize("override, match", [
    ("actors.env_address=[tcp://h:1,tcp://h:1]", "distinct"),
    ("actors.env_address=5", "env_address"),
    ("actors.env_address=[tcp://h:1,'']", "env_address"),
    ("actors.env_grace_s=0", "env_grace_s"),
    ("actors.env_heartbeat_s=-1", "env_heartbeat_s"),
])
def test_bad_env_service_settings_fail_when_composed(override, match):
    with pytest.raises(ValueError, match=match):
        compose([override])


def test_the_actor_config_normalises_its_addresses_in_one_place():
    assert env_addresses(None) == [] and env_addresses("tcp://a:1") == ["tcp://a:1"]
    assert env_addresses(("tcp://a:1", "tcp://b:2")) == ["tcp://a:1", "tcp://b:2"]
    config = ActorConfig(model_path="m", env_address="tcp://a:1", env_slot_offset=4)
    assert config.env_address == ["tcp://a:1"]
    assert dataclasses.replace(config, actor_id=1).env_address == ["tcp://a:1"]  # idempotent
    with pytest.raises(ValueError, match="env_timeout_s"):
        ActorConfig(model_path="m", env_timeout_s=0)
    with pytest.raises(ValueError, match="env_slot_offset is for a shared env service"):
        ActorConfig(model_path="m", env_address=[], env_slot_offset=4)
