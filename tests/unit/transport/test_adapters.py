"""transport/adapters.py: an adapter publish's parts, and the directory an engine loads."""

import json

import pytest
import torch
from safetensors.torch import load_file

from transport import adapters

CONFIG = {"r": 2, "lora_alpha": 4, "target_modules": ["q_proj"], "peft_type": "LORA"}
A = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"


def test_a_publish_splits_into_its_adapter_config_and_probe():
    tensors = [(A, torch.arange(8.0).view(2, 4))]
    extras = adapters.extras(CONFIG, torch.tensor([[5, 6, 7]]), torch.tensor([-1.5, -0.25]))
    publish = adapters.split(tensors + extras)
    assert publish.config == CONFIG and list(publish.tensors) == [A]
    assert torch.equal(publish.tensors[A], tensors[0][1])
    assert publish.probe_ids == [5, 6, 7] and publish.probe_logprobs == [-1.5, -0.25]


@pytest.mark.parametrize("drop,lacks", [(A, "an adapter tensor"), (adapters.CONFIG, adapters.CONFIG),
                                        (adapters.PROBE_LOGPROBS, adapters.PROBE_LOGPROBS)])
def test_a_publish_missing_a_part_is_refused_by_name(drop, lacks):
    parts = [(A, torch.zeros(2, 4))] + adapters.extras(CONFIG, torch.tensor([1, 2]), torch.tensor([0.0]))
    with pytest.raises(ValueError, match=f"lacks .*{lacks}"):
        adapters.split([(n, t) for n, t in parts if n != drop])


def test_an_adapter_directory_appears_whole_and_a_second_writer_keeps_the_first(tmp_path):
    first = {A: torch.ones(2, 4)}
    path = adapters.write_adapter(tmp_path / "v3", CONFIG, first)
    assert json.loads((path / adapters.CONFIG_FILE).read_text()) == CONFIG
    assert torch.equal(load_file(str(path / adapters.WEIGHTS_FILE))[A], first[A])
    adapters.write_adapter(tmp_path / "v3", CONFIG, {A: torch.zeros(2, 4)})  # the same version again
    assert torch.equal(load_file(str(path / adapters.WEIGHTS_FILE))[A], first[A])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v3"]  # no staging directory left
