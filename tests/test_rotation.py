"""Rotations: orthogonality, determinism, the Hadamard path against a dense Hadamard matrix."""

import pytest
import torch

import turboquant as tq
from turboquant.rotation import RandomizedHadamard, _sylvester_hadamard

DIMS = [2, 3, 5, 64, 96, 100, 128, 257]


@pytest.mark.parametrize("kind", ["haar", "hadamard"])
@pytest.mark.parametrize("dim", DIMS)
def test_orthogonal_to_float_precision(kind, dim):
    rot = tq.make_rotation(kind, dim, seed=3)
    pi = rot.matrix().double()
    torch.testing.assert_close(pi @ pi.T, torch.eye(dim, dtype=torch.float64), atol=2e-6, rtol=0)
    x = torch.randn(4, 7, dim)
    y = rot.apply(x)
    torch.testing.assert_close(y, x @ rot.matrix().T, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(rot.inverse(y), x, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1), atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("kind", ["haar", "hadamard"])
def test_seeded(kind):
    a, b, c = (tq.make_rotation(kind, 96, seed=s) for s in (1, 1, 2))
    x = torch.randn(3, 96)
    assert torch.equal(a.apply(x), b.apply(x))
    assert not torch.allclose(a.apply(x), c.apply(x))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("kind", ["haar", "hadamard"])
def test_same_rotation_on_gpu(kind):
    cpu = tq.make_rotation(kind, 96, seed=5)
    gpu = tq.make_rotation(kind, 96, seed=5, device="cuda")
    x = torch.randn(8, 96)
    torch.testing.assert_close(gpu.apply(x.cuda()).cpu(), cpu.apply(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("p", [1, 2, 8, 64, 128, 4096])
def test_fwht_matches_dense_hadamard(p):
    x = torch.randn(5, p, dtype=torch.float64)
    dense = _sylvester_hadamard(p, torch.device("cpu"), torch.float64) / p ** 0.5
    torch.testing.assert_close(tq.fast_walsh_hadamard(x), x @ dense.T, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(tq.fast_walsh_hadamard(tq.fast_walsh_hadamard(x)), x, atol=1e-12, rtol=1e-12)


def test_power_of_two_hadamard_is_h_times_signs():
    rot = tq.RandomizedHadamard(64, seed=0)
    dense = _sylvester_hadamard(64, torch.device("cpu"), torch.float32) / 8.0
    torch.testing.assert_close(rot.matrix(), dense * rot.signs[0], atol=1e-6, rtol=0)


def test_haar_sign_fix_gives_unbiased_diagonal():
    # Without the sign fix, QR's convention makes diag(Q) skew positive; Haar matrices have E[Q_ii] = 0.
    diag = torch.stack([torch.diagonal(tq.HaarRotation(8, seed=s).matrix()) for s in range(400)])
    assert diag.mean().abs() < 4 * diag.std() / (diag.numel() ** 0.5)


def test_to_device_keeps_the_map():
    rot = tq.make_rotation("haar", 16, seed=2)
    torch.testing.assert_close(rot.to("cpu").matrix(), rot.matrix())


def test_errors():
    with pytest.raises(ValueError, match="rotation must be one of"):
        tq.make_rotation("givens", 8)
    with pytest.raises(ValueError, match="dim must be an integer ≥ 2"):
        tq.HaarRotation(1)
    with pytest.raises(ValueError, match="x must have last dimension 8"):
        tq.make_rotation("hadamard", 8).apply(torch.randn(3, 9))
    with pytest.raises(ValueError, match="power-of-two length"):
        tq.fast_walsh_hadamard(torch.randn(3, 6))


def test_rotation_streams_are_independent_of_the_global_torch_stream():
    """Π comes from a generator seeded with a hash of (seed, kind, dim): data drawn from torch's global stream
    after ``torch.manual_seed(seed)`` is not correlated with it (before, the Haar Π was the QR of exactly those
    draws and D_mse came out 6x the codebook's), and building Π leaves the global stream where it was."""
    torch.manual_seed(0)
    state = torch.get_rng_state()
    q = tq.TurboQuantMSE(64, 2, seed=0, backend="torch")
    assert torch.equal(torch.get_rng_state(), state)
    x = torch.randn(4000, 64)
    x = x / x.norm(dim=-1, keepdim=True)
    measured = ((q.dequantize(q.quantize(x)) - x) ** 2).sum(-1).mean().item()
    assert measured == pytest.approx(q.codebook.mse, rel=0.05)
    assert torch.equal(tq.HaarRotation(64, seed=0).matrix(), tq.HaarRotation(64, seed=0).matrix())
    assert not torch.allclose(tq.HaarRotation(64, seed=0).matrix(), tq.HaarRotation(64, seed=1).matrix())


def test_the_hadamard_transform_copies_its_factors_to_a_device_once(monkeypatch):
    """A copy from host memory to a GPU makes the host wait for the GPU; the transform's ±1 factors are made once per
    device and dtype, not copied at every call (a KV cache transforms each decode step's token). Checked on the meta
    device, where a copy is visible as a ``Tensor.to`` from the CPU."""
    rotation = RandomizedHadamard(128, seed=0, device="meta")
    x = torch.empty(3, 128, device="meta")
    rotation.apply(x)  # the first call may make them
    copies = []
    to = torch.Tensor.to

    def recording_to(self, *args, **kwargs):
        out = to(self, *args, **kwargs)
        if self.device.type == "cpu" and out.device.type != "cpu":
            copies.append(tuple(self.shape))
        return out
    monkeypatch.setattr(torch.Tensor, "to", recording_to)
    rotation.apply(x), rotation.inverse(x), rotation.matrix()
    monkeypatch.undo()
    assert copies == []
