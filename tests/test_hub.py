"""`--model org/name` from the Hugging Face Hub: planned from a real cache laid out as
huggingface_hub lays it out, offline (there is no network in CI), and every failure one line."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from helpers import REPO, run_cli
from kvplan.specs.registry import load_model

hf = pytest.importorskip("huggingface_hub")

CORPUS = REPO / "tests" / "fixtures" / "hf" / "corpus"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
NVFP4 = "nvidia/DeepSeek-V3.2-NVFP4"  # config.json + ModelOpt's hf_quant_config.json
NEXT = "Qwen/Qwen3-Next-80B-A3B-Thinking"  # config.json alone


def cache_repo(cache: Path, repo_id: str, files: dict[str, Path], commit: str = COMMIT) -> Path:
    """Lay a model repository out as huggingface_hub's cache does (see hf_hub_download's docstring):
    blobs/ named by each file's git blob hash (its ETag on the Hub), refs/main holding the commit,
    snapshots/<commit>/<file> a relative symlink to its blob."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    blobs, snapshot = repo / "blobs", repo / "snapshots" / commit
    for folder in (blobs, snapshot, repo / "refs"):
        folder.mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    for name, src in files.items():
        data = src.read_bytes()
        sha = git_blob_sha(data)
        (blobs / sha).write_bytes(data)
        (snapshot / name).symlink_to(Path("..", "..", "blobs", sha))
    return snapshot


def git_blob_sha(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@pytest.fixture
def hf_cache() -> Path:
    """The empty offline cache conftest points HF_HUB_CACHE at, with two real repositories in it."""
    cache = Path(os.environ["HF_HUB_CACHE"])
    folder = CORPUS / "deepseek-v3.2-nvfp4"
    cache_repo(
        cache,
        NVFP4,
        {"config.json": folder / "config.json", "hf_quant_config.json": folder / "hf_quant_config.json"},
    )
    cache_repo(cache, NEXT, {"config.json": CORPUS / "qwen3-next-80b-a3b-thinking.json"})
    return cache


def test_the_library_finds_the_hand_laid_cache(hf_cache):
    found = hf.try_to_load_from_cache(NVFP4, "hf_quant_config.json")
    assert found == str(
        hf_cache / f"models--{NVFP4.replace('/', '--')}" / "snapshots" / COMMIT / "hf_quant_config.json"
    )
    assert hf.hf_hub_download(NEXT, "config.json", local_files_only=True).endswith(f"{COMMIT}/config.json")
    assert hf.try_to_load_from_cache(NEXT, "hf_quant_config.json") is None


def test_estimate_plans_from_the_cache_offline_as_from_the_folder(hf_cache):
    r = run_cli("estimate", "-m", NVFP4, "--gpus", "8xB200", "--json")
    assert r.exit_code == 0, r.stderr
    local = run_cli(
        "estimate", "-m", str(CORPUS / "deepseek-v3.2-nvfp4"), "--gpus", "8xB200", "--json"
    ).json()
    hub = r.json()
    assert hub["model"]["name"] == NVFP4  # named by its repository, not by the snapshot's commit
    # hf_quant_config.json's kv_cache_quant_algo FP8: --kv-cache-dtype auto is fp8 (fp8_ds_mla 656 B + the
    # indexer key 132 B, 61 layers), as the engines resolve it
    assert hub["kv_bytes_per_token"] == local["kv_bytes_per_token"] == 61 * (656 + 132)
    assert hub["settings"]["kv_cache_dtype"] == "fp8_e4m3"
    # hf_quant_config.json came along from the same snapshot: NVFP4 weights, as for the folder
    assert hub["weight_bytes_total"] == local["weight_bytes_total"]
    assert load_model(NVFP4).weight_formats["attention"] == "nvfp4"


def test_a_repository_without_sidecars_and_a_pinned_revision(hf_cache):
    spec = load_model(NEXT)
    assert spec.name == NEXT and spec.num_layers == 48
    assert load_model(f"{NEXT}@{COMMIT}").num_layers == 48
    assert load_model(f"{NEXT}@main").num_layers == 48


def test_every_command_taking_a_model_reads_the_hub(hf_cache):
    r = run_cli("solve", "-m", NEXT, "--users", "4", "--max-model-len", "32K", "--json")
    assert r.exit_code == 0, r.stderr
    r = run_cli("compare", "table", "--models", f"llama3-8b,{NEXT}", "--format", "json")
    assert r.exit_code == 0, r.stderr
    assert NEXT in r.stdout
    log = REPO / "tests" / "fixtures" / "logs" / "real" / "vllm_0.10.2_qwen3-next-80b-a3b_h200_tp2.log"
    r = run_cli("check-log", str(log), "--model", NEXT, "--gpus", "H200", "--json")
    assert r.exit_code == 0, r.stderr
    weights = r.json()["rows"][0]
    assert r.json()["setup"]["model"] == NEXT and weights["quantity"] == "weights per GPU"
    assert abs(weights["difference"]) < 0.005  # the real vLLM log's weights, from the cached config.json


def test_the_real_environment_variables_in_a_fresh_process(hf_cache, tmp_path):
    env = {
        **os.environ,
        "HF_HUB_CACHE": str(hf_cache),
        "HF_HUB_OFFLINE": "1",
        "KVPLAN_DATA_DIR": str(tmp_path),
    }
    r = subprocess.run(
        [sys.executable, "-m", "kvplan", "estimate", "-m", NEXT, "--gpus", "4xH100", "--json"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["model"]["name"] == NEXT


def one_line_error(*args: str) -> str:
    r = run_cli(*args)
    assert r.exit_code == 2, (r.stdout, r.stderr)
    message = r.stderr.strip()
    assert message.startswith("error:") and "\n" not in message and "Traceback" not in message
    return message


def test_offline_and_not_cached_is_one_line(hf_cache):
    message = one_line_error("estimate", "-m", "acme/not-cached-7b")
    assert "acme/not-cached-7b" in message and "HF_HUB_OFFLINE" in message
    assert "config.json" in message and "folder" in message and str(hf_cache) in message


@pytest.fixture
def online(monkeypatch):
    """The library believes it is online; each test says what the Hub answers."""
    monkeypatch.setattr(hf.constants, "HF_HUB_OFFLINE", False)

    def no_download(*args, **kwargs):
        raise AssertionError("nothing may be downloaded in this test")

    monkeypatch.setattr(hf, "hf_hub_download", no_download)


def answer(monkeypatch, exc: Exception) -> None:
    def head(*args, **kwargs):
        raise exc

    monkeypatch.setattr(hf, "get_hf_file_metadata", head)


def http_error(cls: type[Exception], status: int, text: str) -> Exception:
    httpx = pytest.importorskip("httpx2")
    url = "https://huggingface.co/acme/m/resolve/main/config.json"
    return cls(text, response=httpx.Response(status, request=httpx.Request("HEAD", url)))


def test_gated_is_one_line_naming_hf_token(hf_cache, online, monkeypatch):
    answer(monkeypatch, http_error(hf.errors.GatedRepoError, 403, "Cannot access gated repo\nline two"))
    message = one_line_error("estimate", "-m", "meta-llama/Llama-9-Secret")
    assert "gated" in message and "HF_TOKEN" in message and "huggingface-cli login" in message
    assert "meta-llama/Llama-9-Secret" in message


def test_not_on_the_hub_says_what_else_works(hf_cache, online, monkeypatch):
    answer(monkeypatch, http_error(hf.errors.RepositoryNotFoundError, 401, "Repository Not Found"))
    message = one_line_error("estimate", "-m", "acme/no-such-model")
    assert "unknown model 'acme/no-such-model'" in message
    assert "Hugging Face Hub" in message and "config.json" in message and "folder" in message


def test_no_network_fails_at_once_in_one_line(hf_cache, online, monkeypatch):
    answer(monkeypatch, OSError("[Errno -2] Name or service not known"))
    message = one_line_error("estimate", "-m", "acme/far-away")
    assert "cannot be reached" in message and "Name or service not known" in message
    assert "HF_HUB_OFFLINE" in message and "config.json" in message


def test_online_a_cached_config_is_checked_by_the_library_and_missing_sidecars_probed(
    hf_cache, online, monkeypatch
):
    probed: list[str] = []
    missing = getattr(hf.errors, "RemoteEntryNotFoundError", hf.errors.EntryNotFoundError)

    def head(url, **kwargs):
        probed.append(url)
        raise http_error(missing, 404, "Entry Not Found")

    monkeypatch.setattr(hf, "get_hf_file_metadata", head)
    downloads: list[tuple] = []

    def download(repo_id, filename, **kwargs):
        downloads.append((repo_id, filename, kwargs["revision"]))
        return hf.try_to_load_from_cache(repo_id, filename, revision=kwargs["revision"])

    monkeypatch.setattr(hf, "hf_hub_download", download)
    assert load_model(NEXT).name == NEXT
    assert downloads == [(NEXT, "config.json", None)]  # the library revalidates main, or falls back
    assert [url.rsplit("/", 2)[1:] for url in probed] == [
        [COMMIT, "hf_quant_config.json"],
        [COMMIT, "model.safetensors.index.json"],
        [COMMIT, "modules.json"],
        [COMMIT, "preprocessor_config.json"],
        [COMMIT, "video_preprocessor_config.json"],
    ]


def test_a_shipped_model_never_imports_huggingface_hub():
    code = (
        "import sys; from kvplan.cli import app\n"
        "try:\n    app(['estimate', '-m', 'llama3-8b', '--json'])\n"
        "except SystemExit as e: assert not e.code, e.code\n"
        "try:\n    app(['estimate', '-m', 'Qwen/Qwen3-32B', '-g', '2xH100', '--json'])\n"  # a shipped HF id
        "except SystemExit as e: assert not e.code, e.code\n"
        "assert 'huggingface_hub' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


def test_local_paths_are_never_hub_ids(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "org" / "name").mkdir(parents=True)
    message = one_line_error("estimate", "-m", "org/name")
    assert "a folder without a config.json" in message


# --- the library's own download path, against a local stand-in for the Hub -------------------


class FakeHub(BaseHTTPRequestHandler):
    """/{org}/{name}/resolve/{revision}/{file} answered with the headers the Hub sends:
    X-Repo-Commit, the file's git hash as ETag; X-Error-Code on failures (GatedRepo, EntryNotFound)."""

    repos: dict[str, dict[str, bytes]] = {}
    gated = {"acme/gated-70b"}

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def do_GET(self) -> None:
        self._answer(body=True)

    def _answer(self, body: bool) -> None:
        parts = self.path.split("/")
        repo_id, filename = "/".join(parts[1:3]), "/".join(parts[5:])
        data = self.repos.get(repo_id, {}).get(filename)
        if repo_id in self.gated:
            status, code = 403, "GatedRepo"
        elif repo_id not in self.repos:
            status, code = 401, "RepoNotFound"
        elif data is None:
            status, code = 404, "EntryNotFound"
        else:
            status, code = 200, None
        self.send_response(status)
        self.send_header("X-Repo-Commit", COMMIT)
        if code:
            self.send_header("X-Error-Code", code)
            self.send_header("Content-Length", "0")
        else:
            self.send_header("ETag", f'"{git_blob_sha(data)}"')
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body and data is not None:
            self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def fake_hub():
    folder = CORPUS / "deepseek-v3.2-nvfp4"
    FakeHub.repos = {
        NVFP4: {name: (folder / name).read_bytes() for name in ("config.json", "hf_quant_config.json")}
    }
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeHub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def kvplan_process(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kvplan", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        check=False,
        timeout=60,
    )


def tree(root: Path) -> dict[str, str]:
    """Each path under root: where a link points, else the file's bytes, else "folder"."""
    return {
        str(p.relative_to(root)): os.readlink(p)
        if p.is_symlink()
        else (p.read_text() if p.is_file() else "folder")
        for p in root.rglob("*")
    }


def test_downloaded_by_the_library_then_planned_offline(fake_hub, tmp_path):
    cache = tmp_path / "hub"
    online = {"HF_ENDPOINT": fake_hub, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "0"}
    r = kvplan_process(online, "estimate", "-m", NVFP4, "--gpus", "8xB200", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["kv_bytes_per_token"] == 61 * (656 + 132)  # fp8: kv_cache_quant_algo FP8
    # the library wrote the very layout cache_repo lays out by hand: names, links, bytes
    by_hand = tmp_path / "by-hand"
    folder = CORPUS / "deepseek-v3.2-nvfp4"
    cache_repo(by_hand, NVFP4, {n: folder / n for n in ("config.json", "hf_quant_config.json")})
    repo = f"models--{NVFP4.replace('/', '--')}"
    assert tree(cache / repo) == tree(by_hand / repo)
    assert (cache / repo / "snapshots" / COMMIT / "config.json").is_symlink()
    offline = {**online, "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"}
    r2 = kvplan_process(offline, "estimate", "-m", NVFP4, "--gpus", "8xB200", "--json")
    assert r2.returncode == 0, r2.stderr
    assert json.loads(r2.stdout) == json.loads(r.stdout)


def test_the_hubs_own_answers_become_one_line(fake_hub, tmp_path):
    env = {"HF_ENDPOINT": fake_hub, "HF_HUB_CACHE": str(tmp_path), "HF_HUB_OFFLINE": "0"}
    gated = kvplan_process(env, "estimate", "-m", "acme/gated-70b")
    missing = kvplan_process(env, "estimate", "-m", "acme/no-such-7b")
    for r in (gated, missing):
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert "gated" in gated.stderr and "HF_TOKEN" in gated.stderr
    assert "unknown model 'acme/no-such-7b'" in missing.stderr and "Hugging Face Hub" in missing.stderr


def test_a_hub_name_that_says_fp8_without_a_quantization_config_is_warned(hf_cache):
    # issue 24 audit: the warning was tested on folders only. A repository named ...-FP8 whose config.json has no
    # quantization_config (and no hf_quant_config.json beside it) is planned in bf16, and says so
    repo = "someone/Qwen3-Next-80B-A3B-Thinking-FP8"
    cache_repo(hf_cache, repo, {"config.json": CORPUS / "qwen3-next-80b-a3b-thinking.json"})
    r = run_cli("estimate", "-m", repo, "--gpus", "8xH100", "--max-model-len", "8K", "--json")
    assert r.exit_code == 0, r.stderr
    said = " ".join(r.json()["model"]["warnings"]) + r.stderr
    assert "the name says FP8 but there is no quantization_config" in said
    assert r.json()["settings"]["weight_dtype"] == "bf16"
