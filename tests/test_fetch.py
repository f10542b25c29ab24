"""``scale-fpt fetch`` offline: tiny archives laid out as the publishers' (LRA's release, TAPE's
JSON release) served by a local ``http.server`` on loopback as the mirror, and the hub's
Parquet files by the same server answering as the hub does (``HF_ENDPOINT``: the commit and
the file's SHA-256 in the headers of a HEAD) to ``huggingface_hub``'s own client; the fetched
folders pass the preflight and the task loaders read them. Weights: a model in a Hugging Face
cache laid out as the hub's is found offline; one missing is named."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from huggingface_hub import constants
from PIL import Image

from scale_fpt import cli
from scale_fpt.config import TaskConfig
from scale_fpt.preflight import preflight_problems
from scale_fpt.sweep.config import with_data_root
from scale_fpt.tasks import build_task

LRA_ROWS = ["Source\tTarget", "( ( ( [MAX 2 ) 9 ) ] )\t9", "( ( ( [MIN 3 ) 8 ) ] )\t3"]


@pytest.fixture(autouse=True)
def _offline(monkeypatch, scale_fpt_home, tmp_path):
    """No hub, an empty Hugging Face cache: only what the test puts on disk is reachable."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hf-hub"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    monkeypatch.delenv("SCALE_FPT_MIRROR", raising=False)


def tar_gz(members: dict[str, str]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, text in members.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def image_parquet(path: Path, n: int) -> None:
    """A split as the hub's Parquet holds it: an image struct (PNG bytes, path), a label."""
    rng = np.random.default_rng(n)
    images = []
    for _ in range(n):
        png = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (28, 28), dtype=np.uint8)).save(png, "PNG")
        images.append({"bytes": png.getvalue(), "path": None})
    pq.write_table(pa.table({"image": images, "label": list(range(n))}), path)


HUB_FILE = "/datasets/ylecun/mnist/resolve/main/mnist/{}-00000-of-00001.parquet"


@pytest.fixture
def mirror(tmp_path, monkeypatch):
    """The publishers' files under ``<folder>/<file name>`` and the hub's under its own paths,
    served on loopback, the hub's endpoint pointed there: (base URL, the paths asked for,
    {hub path: SHA-256 the hub states, when not the file's own})."""
    root = tmp_path / "mirror"
    for folder in ("listops", "homology"):
        (root / folder).mkdir(parents=True)
    lra = {
        f"lra_release/listops-1000/basic_{s}.tsv": "\n".join(LRA_ROWS) + "\n"
        for s in ("train", "val", "test")
    }
    lra["lra_release/pathfinder32/curv_baseline.tsv"] = "not kept\n"
    (root / "listops" / "lra_release.gz").write_bytes(tar_gz(lra))
    tape = {
        f"remote_homology/remote_homology_{s}.json": json.dumps(
            [{"primary": "MKTAYIAK", "fold_label": 3}, {"primary": "GAV", "fold_label": 0}]
        )
        for s in ("train", "valid", "test_fold_holdout", "test_family_holdout")
    }
    (root / "homology" / "remote_homology.tar.gz").write_bytes(tar_gz(tape))
    for split, n in (("train", 6), ("test", 3)):
        path = root / HUB_FILE.format(split)[1:]
        path.parent.mkdir(parents=True, exist_ok=True)
        image_parquet(path, n)
    asked, stated = [], {}

    class Handler(SimpleHTTPRequestHandler):
        def end_headers(self):
            if self.path.startswith("/datasets/"):
                sha256 = hashlib.sha256((root / self.path[1:]).read_bytes()).hexdigest()
                self.send_header("X-Repo-Commit", "0" * 40)
                self.send_header("ETag", f'"{stated.get(self.path, sha256)}"')
            super().end_headers()

        def do_GET(self):
            asked.append(self.path)
            super().do_GET()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(Handler, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}"
    monkeypatch.setattr(constants, "ENDPOINT", url)  # HF_ENDPOINT, read when the hub loads
    monkeypatch.setattr(
        constants, "HUGGINGFACE_CO_URL_TEMPLATE", url + "/{repo_id}/resolve/{revision}/{filename}"
    )
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    yield url, asked, stated
    server.shutdown()
    server.server_close()


def test_fetch_from_a_mirror_then_the_preflight_passes_and_the_tasks_read_it(
    mirror, tmp_path, capsys
):
    url, asked, _ = mirror
    data = tmp_path / "data"
    tasks = ["--tasks", "listops,homology,mnist", "--inits", "random"]
    argv = ["fetch", "scale", "--preset", "paper", *tasks, "--models", "gpt2-tiny"]
    assert cli.main([*argv, "--data-root", str(data), "--mirror", url]) == 0
    out = capsys.readouterr().out
    assert f"[scale-fpt] fetch listops: downloading {url}/listops/lra_release.gz" in out
    assert f"[scale-fpt] fetch mnist: downloading {url}{HUB_FILE.format('train')}" in out
    assert sorted(p.name for p in (data / "mnist").iterdir()) == [
        "test-00000-of-00001.parquet",
        "train-00000-of-00001.parquet",
    ]  # as the hub names them, nothing of the hub client's own beside them
    assert sorted(p.name for p in (data / "listops").iterdir()) == [
        "basic_test.tsv",
        "basic_train.tsv",
        "basic_val.tsv",
    ]  # the archive's other members are never written
    assert sorted(p.name for p in (data / "homology").iterdir()) == [
        "remote_homology_test_fold_holdout.json",
        "remote_homology_train.json",
        "remote_homology_valid.json",
    ]
    arms = [
        with_data_root({"task": t, "model": "gpt2-tiny", "init": "random"}, str(data))
        for t in ("listops", "homology", "mnist")
    ]
    assert preflight_problems(arms) == []
    assert build_task(TaskConfig(task="listops", data_dir=str(data / "listops")), 0).spec
    homology = build_task(TaskConfig(task="homology", data_dir=str(data / "homology")), 0)
    assert homology.train_batch(0, 2).y.view(-1).tolist() in ([3, 0], [0, 3])
    mnist = build_task(TaskConfig(task="mnist", data_dir=str(data / "mnist")), 0)
    assert sum(len(b.y) for b in mnist.eval_batches("test", 8)) == 3

    asked.clear()  # a second run finds everything in place and asks the mirror for nothing
    assert cli.main([*argv, "--data-root", str(data), "--mirror", url]) == 0
    assert asked == []
    assert f"[scale-fpt] fetch mnist: already in {data / 'mnist'}" in capsys.readouterr().out


def test_a_download_that_differs_from_its_stated_checksum_is_refused(mirror, tmp_path, capsys):
    url, _, stated = mirror
    stated[HUB_FILE.format("test")] = "0" * 64
    data = tmp_path / "data"
    assert cli.main(["fetch", "--tasks", "mnist", "--data-root", str(data)]) == 1
    err = capsys.readouterr().err
    assert f"scale-fpt: fetch failed: mnist: {url}{HUB_FILE.format('test')}: SHA-256 " in err
    assert f"differs from the stated {'0' * 64}" in err
    assert sorted(p.name for p in (data / "mnist").iterdir()) == ["train-00000-of-00001.parquet"]


def test_a_mirror_that_cannot_be_reached_and_a_missing_data_root_are_named(tmp_path, capsys):
    assert cli.main(["fetch", "--tasks", "homology,bit-xor"]) == 2
    assert "fetch: homology need(s) --data-root DIR" in capsys.readouterr().err
    argv = ["fetch", "--tasks", "homology", "--data-root", str(tmp_path)]
    assert cli.main([*argv, "--mirror", str(tmp_path / "nowhere")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("scale-fpt: fetch failed: homology: ")
    assert "No such file or directory" in err
    assert not (tmp_path / "homology").exists()  # no empty folder stands for the data


def test_weights_in_the_hub_cache_are_found_offline_and_missing_ones_named(
    tmp_path, tiny_gpt2_dir, capsys
):
    from huggingface_hub import constants

    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = Path(constants.HF_HUB_CACHE) / "models--local--tiny-gpt2"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for path in Path(tiny_gpt2_dir).iterdir():
        (snapshot / path.name).write_bytes(path.read_bytes())
    assert cli.main(["fetch", "--models", "local/tiny-gpt2"]) == 0
    assert "[scale-fpt] fetch local/tiny-gpt2: already in the Hugging Face cache" in (
        capsys.readouterr().out
    )
    assert preflight_problems([{"task": "bit-xor", "model": "local/tiny-gpt2"}]) == []
    assert cli.main(["fetch", "--models", "local/tiny-gpt2,gpt2-medium"]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(
        "scale-fpt: fetch failed: gpt2-medium: the Hugging Face hub cannot be reached (no "
        "network, or HF_HUB_OFFLINE is set) and it is not in the cache"
    )
