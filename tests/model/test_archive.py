"""The ``.tirpat`` file checked before ``tp.load`` loads anything: the manifest's SHA-256 and
size of ``model.so``, every manifest key, the archive itself; each problem a ``ValueError``
naming the file and what is wrong, never a crash or a bare ``KeyError``; the temporary
directory removed on every path; the library of another file never loaded (its code never
runs)."""

import json
import pathlib
import runpy
import shutil
import subprocess
import tempfile
import zipfile

import numpy as np
import pytest

import tirpat as tp
from tirpat.model import archive

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The example MLP compiled for accel, exported: ``(path, library bytes, manifest, model)``."""
    path = tmp_path_factory.mktemp("archive") / "m.tirpat"
    built = tp.build(runpy.run_path(str(ROOT / "examples" / "models" / "mlp_int8.py"))["Module"], "accel, llvm")
    built.export(path)
    with zipfile.ZipFile(path) as z:
        return path, z.read(archive.LIBRARY), json.loads(z.read(archive.MANIFEST)), built


@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    """tempfile's directory, for this test alone: what tp.load leaves there can be seen."""
    where = tmp_path / "tmp"
    where.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(where))
    return where


def _write(path, library: bytes, manifest) -> None:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(archive.LIBRARY, library)
        z.writestr(archive.MANIFEST, manifest if isinstance(manifest, str) else json.dumps(manifest))


def test_the_manifest_records_the_library(exported, private_tmp):
    import hashlib

    path, library, manifest, built = exported
    assert manifest["library"] == {"name": "model.so", "size": len(library),
                                   "sha256": hashlib.sha256(library).hexdigest()}
    x = np.random.default_rng(0).integers(-128, 128, (16, 64), dtype=np.int8)
    np.testing.assert_array_equal(tp.load(path)(x), built(x))
    assert list(private_tmp.iterdir()) == [], "the library's directory is removed once it is loaded"


@pytest.mark.parametrize("change, fragment", [
    (lambda lib: lib[: len(lib) // 2], "its model.so is truncated (or replaced): {half} bytes, the manifest records {n}"),
    (lambda lib: lib + b"\0", "its model.so is longer than the manifest records ({n} bytes): the file was changed"),
    (lambda lib: lib[:100] + bytes([lib[100] ^ 1]) + lib[101:],
     "its model.so does not match the SHA-256 its manifest records: the file was changed after tirpat wrote it"),
])
def test_a_damaged_library_is_never_loaded(exported, tmp_path, private_tmp, change, fragment):
    """A truncated model.so (with a zip CRC that matches) killed the process with SIGBUS."""
    path, library, manifest, _ = exported
    bad = tmp_path / "bad.tirpat"
    _write(bad, change(library), manifest)
    with pytest.raises(ValueError) as err:
        tp.load(bad)
    assert str(err.value).startswith(f"{bad}: " + fragment.format(half=len(library) // 2, n=len(library))), err.value
    assert list(private_tmp.iterdir()) == [], "the temporary directory is removed on an error too"


@pytest.mark.parametrize("key", ["format", "entry", "host", "backends", "inputs", "report", "library"])
def test_a_manifest_without_a_key_says_which(exported, tmp_path, private_tmp, key):
    """A manifest without 'backends' was "error: 'backends'" (a KeyError) in tirpat run."""
    path, library, manifest, _ = exported
    bad = tmp_path / "bad.tirpat"
    _write(bad, library, {k: v for k, v in manifest.items() if k != key})
    want = {"format": "not a tirpat-model/1 file (format None)",
            "library": "its manifest has no record of model.so's SHA-256"}.get(key, f"its manifest has no {key!r}")
    with pytest.raises(ValueError, match=f"^{tmp_path}/bad.tirpat: " + want.replace("(", r"\(").replace(")", r"\)")):
        tp.load(bad)
    assert list(private_tmp.iterdir()) == []


@pytest.mark.parametrize("edit, fragment", [
    (lambda m: {**m, "backends": "accel"}, "its manifest's 'backends' is a JSON str, not a list"),
    (lambda m: {**m, "backends": [{"options": {}}]}, "its manifest is malformed (KeyError: 'name')"),
    (lambda m: {**m, "inputs": [{"name": "x"}]}, "its manifest is malformed (KeyError: 'shape')"),
    (lambda m: {**m, "library": {**m["library"], "sha256": "00"}}, "its manifest's record of model.so has no valid"),
    (lambda m: {**m, "host": {"kind": "no-such-kind"}}, "its manifest's host target is not one TVM takes"),
])
def test_a_malformed_manifest_says_what(exported, tmp_path, private_tmp, edit, fragment):
    path, library, manifest, _ = exported
    bad = tmp_path / "bad.tirpat"
    _write(bad, library, edit(manifest))
    with pytest.raises(ValueError, match="^" + f"{tmp_path}/bad.tirpat: ".replace(".", r"\.")):
        try:
            tp.load(bad)
        except ValueError as err:
            assert fragment in str(err), str(err)
            raise
    assert list(private_tmp.iterdir()) == []


def test_archives_that_are_not_models(exported, tmp_path, private_tmp):
    path, library, manifest, _ = exported
    cases = {"no_library.tirpat": ({archive.MANIFEST: json.dumps(manifest)}, "the archive has no model.so"),
             "no_manifest.tirpat": ({archive.LIBRARY: library}, "not a model exported by tirpat (the archive has no "
                                                                "manifest.json)"),
             "not_json.tirpat": ({archive.LIBRARY: library, archive.MANIFEST: "{"}, "its manifest.json is not valid JSON"),
             "a_list.tirpat": ({archive.LIBRARY: library, archive.MANIFEST: "[]"}, "is not a JSON object")}
    for name, (members, fragment) in cases.items():
        with zipfile.ZipFile(tmp_path / name, "w") as z:
            for member, data in members.items():
                z.writestr(member, data)
        with pytest.raises(ValueError) as err:
            tp.load(tmp_path / name)
        assert str(err.value).startswith(f"{tmp_path / name}: ") and fragment in str(err.value), str(err.value)
    (tmp_path / "cut.tirpat").write_bytes(path.read_bytes()[:-100])    # the zip's directory cut off
    with pytest.raises(ValueError, match="not a model exported by tirpat, or a damaged one"):
        tp.load(tmp_path / "cut.tirpat")
    assert list(private_tmp.iterdir()) == []


def test_a_library_that_does_not_load_is_a_value_error(exported, tmp_path, private_tmp):
    """Its manifest's record matches (a file written by hand): the dynamic loader's refusal is
    the error, and the directory still goes."""
    path, _, manifest, _ = exported
    garbage = tmp_path / "garbage.so"
    garbage.write_bytes(b"not a shared library" * 64)
    archive.write_archive(tmp_path / "g.tirpat", garbage, {k: v for k, v in manifest.items() if k != "library"})
    with pytest.raises(ValueError, match=r"g\.tirpat: its model\.so cannot be loaded \(invalid ELF header\)$"):
        tp.load(tmp_path / "g.tirpat")
    assert list(private_tmp.iterdir()) == []


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc to build a library with a constructor")
def test_another_library_in_a_models_file_never_runs(exported, tmp_path):
    """A .tirpat whose model.so was replaced, its manifest kept: the replacement's constructor
    ran as tp.load opened it, before any check."""
    path, _, manifest, _ = exported
    marker = tmp_path / "CODE_RAN"
    (tmp_path / "evil.c").write_text('#include <stdio.h>\n__attribute__((constructor)) static void f(void)'
                                     '{FILE*x=fopen("%s","w");if(x){fputs("ran",x);fclose(x);}}\n' % marker)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", tmp_path / "evil.so", tmp_path / "evil.c"], check=True)
    _write(tmp_path / "evil.tirpat", (tmp_path / "evil.so").read_bytes(), manifest)
    with pytest.raises(ValueError, match="model.so"):
        tp.load(tmp_path / "evil.tirpat")
    assert not marker.exists()


def test_load_docstring_and_readme_say_a_tirpat_runs_native_code():
    assert "Loading a ``.tirpat`` runs native code" in tp.load.__doc__ and "Load only files you trust" in tp.load.__doc__
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "loading a `.tirpat` runs the native code it holds, as loading any shared library does, so load only " \
           "`.tirpat` files you trust" in readme


def test_a_loaded_model_exports_again_and_export_replaces_only_a_tirpat(exported, tmp_path):
    """A model tp.load read exports (its library is kept: TVM's loaded one cannot save itself),
    and the copy runs as the original; export replaces an existing file only if it is a .tirpat
    (never the ONNX model or the data a user names by mistake)."""
    path, library, _, built = exported
    again = tp.load(path).export(tmp_path / "again.tirpat")
    with zipfile.ZipFile(again) as z:
        assert z.read(archive.LIBRARY) == library
    x = np.random.default_rng(1).integers(-128, 128, (16, 64), dtype=np.int8)
    np.testing.assert_array_equal(tp.load(again)(x), built(x))
    kept = tmp_path / "model.onnx"
    kept.write_bytes(b"an ONNX model")
    with pytest.raises(FileExistsError, match="model.onnx: exists and its name does not end in .tirpat"):
        built.export(kept)
    assert kept.read_bytes() == b"an ONNX model"
    built.export(again)         # a .tirpat is replaced
