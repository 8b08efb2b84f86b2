"""``import tirpat as tp``: what ``dir(tp)`` shows is tirpat's own (``__all__`` and its
subpackages), not a module it happens to import."""

import types

import tirpat as tp


def test_public_names_are_tirpats_own():
    stray = [name for name in dir(tp) if not name.startswith("_") and name not in tp.__all__
             and not (isinstance(getattr(tp, name), types.ModuleType) and getattr(tp, name).__name__ == f"tirpat.{name}")]
    assert stray == []
    assert not hasattr(tp, "importlib")


def test_every_public_name_resolves():
    for name in tp.__all__:
        assert getattr(tp, name) is not None, name
