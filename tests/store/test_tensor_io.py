"""Stored tensors to safetensors files and back, and the CUDA-destination reads' refusal on a
host without a GPU (a real master process, a client with its own segment)."""

from __future__ import annotations

import pytest
import torch

from mooncake_core.store.tensor_io import _safetensors_torch


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_safetensors_round_trip_and_cuda_refusal(master_factory, client_factory, tmp_path, caplog) -> None:
    m = master_factory(default_kv_lease_ttl=200)
    c = client_factory(m, segment=16 << 20)
    cases = {"f32": torch.randn(3, 5), "i32": torch.arange(7, dtype=torch.int32),
             "bool": torch.tensor([True, False, True]), "bf16": torch.randn(2, 3, 4).to(torch.bfloat16)}
    for key, t in cases.items():
        path = str(tmp_path / f"{key}.safetensors")
        assert c.put_tensor(key, t) == 0
        assert c.save_tensor_to_safetensor(key, path) == 0
        assert torch.equal(_safetensors_torch().load_file(path)[key], t)  # a file other tools read
        back = c.load_tensor_from_safetensor(f"{key}-copy", path)  # no tensor of that name: the first one
        assert torch.equal(back, t) and torch.equal(c.get_tensor(f"{key}-copy"), t)
    # the default file name is the key; the default key is the file name
    monkey_dir = tmp_path / "cwd"
    monkey_dir.mkdir()
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(monkey_dir)
        assert c.save_tensor_to_safetensor("f32") == 0 and (monkey_dir / "f32").exists()
        assert torch.equal(c.load_tensor_from_safetensor(file_name="f32"), cases["f32"])
    assert c.save_tensor_to_safetensor("nosuch", str(tmp_path / "x")) == -704
    assert c.load_tensor_from_safetensor("k", str(tmp_path / "missing.safetensors")) is None
    (tmp_path / "junk").write_bytes(b"not a safetensors file")
    assert c.load_tensor_from_safetensor("k", str(tmp_path / "junk")) is None and c.is_exist("k") == 0

    # CUDA destinations: a CPU tensor is refused with a message naming the missing GPU
    dst = torch.empty(3, 5)
    with caplog.at_level("ERROR"):
        assert c.get_tensor_into_cuda("f32", dst) == -600
    assert "not a CUDA tensor" in caplog.text
    assert c.batch_get_tensor_into_cuda(["f32", "i32"], [dst]) == [-600, -600]
    if torch.cuda.is_available():
        gpu = torch.empty(3, 5, device="cuda")
        assert c.get_tensor_into_cuda("f32", gpu) == 60 and torch.equal(gpu.cpu(), cases["f32"])
        assert c.batch_get_tensor_into_cuda(["nosuch", "i32"], [gpu, gpu]) == [-704, -600]
