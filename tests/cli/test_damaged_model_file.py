"""``tirpat run`` of a damaged or edited ``.tirpat``: one line naming the file and the
problem, exit status 1; a truncated library killed it with SIGBUS, a manifest without
'backends' said "error: 'backends'"."""

import json
import runpy
import zipfile

import pytest


@pytest.fixture(scope="module")
def exported(tmp_path_factory, example_mlp):
    import tirpat as tp

    path = tmp_path_factory.mktemp("damaged") / "m.tirpat"
    tp.build(runpy.run_path(str(example_mlp))["Module"], "accel, llvm").export(path)
    with zipfile.ZipFile(path) as z:
        return z.read("model.so"), json.loads(z.read("manifest.json"))


def _write(path, library: bytes, manifest: dict) -> None:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:      # the zip's CRCs match the bytes written
        z.writestr("model.so", library)
        z.writestr("manifest.json", json.dumps(manifest))


def test_run_of_a_truncated_library(exported, tirpat, error_line, tmp_path):
    library, manifest = exported
    _write(tmp_path / "t.tirpat", library[: len(library) // 2], manifest)
    error_line(tirpat("run", "t.tirpat", cwd=tmp_path),
               f"tirpat run: error: t.tirpat: its model.so is truncated (or replaced): {len(library) // 2} bytes, "
               f"the manifest records {len(library)}")


def test_run_of_a_manifest_without_a_key(exported, tirpat, error_line, tmp_path):
    library, manifest = exported
    _write(tmp_path / "k.tirpat", library, {k: v for k, v in manifest.items() if k != "backends"})
    error_line(tirpat("run", "k.tirpat", cwd=tmp_path), "tirpat run: error: k.tirpat: its manifest has no 'backends'")
