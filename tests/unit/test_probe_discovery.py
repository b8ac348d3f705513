"""The probe's model discovery walks every live object: lazy proxies must neither raise nor be loaded."""

from __future__ import annotations

import weakref

import pytest

torch = pytest.importorskip("torch")

from workers.rank.probe_model import is_module as _is_module  # noqa: E402


class _LazyClient:
    """Like openai's module-level client: computing __class__ loads (and here fails to load) a client."""

    loaded = 0

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        _LazyClient.loaded += 1
        raise RuntimeError("The api_key client option must be set")


def test_discovery_uses_the_real_type_and_never_touches_a_lazy_proxy() -> None:
    module = torch.nn.Linear(2, 2)
    dead = weakref.proxy(torch.nn.Linear(1, 1))  # its object is gone at once
    lazy = _LazyClient()
    assert _is_module(module, torch.nn.Module)
    assert not _is_module(lazy, torch.nn.Module) and _LazyClient.loaded == 0
    assert not _is_module(dead, torch.nn.Module)
    with pytest.raises(RuntimeError):
        isinstance(lazy, torch.nn.Module)  # what discovery did before: the trainer's first step died here
