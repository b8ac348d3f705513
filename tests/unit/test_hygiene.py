"""Evidence hygiene: each kind of finding is planted in a real file and must be found; clean files pass.

Planted secrets and paths are assembled at run time (string concatenation), so this file passes hygiene itself.
"""

from __future__ import annotations

import io
import json
import struct
import subprocess
import zipfile
from pathlib import Path

import pytest
from cliutil import orch

from ledger.files.hygiene import Finding, scan_paths, this_host_names

HOSTS = ["gpu-node-17.cluster.internal", "gpu-node-17"]


def _kinds(findings: list[Finding]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for f in findings:
        out.setdefault(Path(f.path).name, set()).add(f.kind)
    return out


def _torch_zip() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
        zf.writestr("archive/data/0", b"\x00" * 16)
    return buf.getvalue()


def _plant(root: Path) -> None:
    (root / "docs").mkdir()
    header = b'{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'
    files: dict[str, bytes] = {
        "weights.dat": _torch_zip(),
        "state.dat": b"\x80\x04\x95" + b"\x00" * 20,
        "tensor.dat": struct.pack("<Q", len(header)) + header + b"\x00" * 4,
        "array.dat": b"\x93NUMPY\x01\x00" + b"v" * 20,
        "model.pt": b"not really a model",
        "sample.dat": b"\x89PNG\r\n\x1a\n" + b"\x00" * 30,
        "photo.jpg": b"\xff\xd8\xff\xe0" + b"\x00" * 30,
        "profile.json": json.dumps({"traceEvents": [{"ph": "X", "name": "k"}]}).encode(),
        "run.nsys-rep": b"\x00\x01binary",
        "rollout.jsonl": b"".join(
            json.dumps({"sample": i, "prompt": "p", "reward": 0.5}).encode() + b"\n" for i in range(4)
        ),
        "grpo_reward_trace.txt": b"step 1\n",
        "listing.txt": b"".join(f"images/{i:05d}.jpg {'ab' * 32}\n".encode() for i in range(25)),
    }
    for name, data in files.items():
        (root / name).write_bytes(data)
    (root / "docs" / "figure.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 30)
    secrets = {
        "pem.txt": "-----BEGIN RSA " + "PRIVATE KEY-----\nMIIE\n",
        "aws.txt": "key = " + "AKIA" + "ABCDEFGHIJKLMNOP\n",
        "gh.txt": "token: " + "gh" + "p_" + "a1B2" * 9 + "\n",
        "ghpat.txt": "github" + "_pat_" + "11ABCDEFG" + "x" * 30 + "\n",
        "hf.txt": "HF_TOKEN=" + "hf" + "_" + "Ab1" * 12 + "\n",
        "wandb.sh": "export WANDB_API" + "_KEY=" + "0123456789abcdef" * 2 + "01234567\n",
        "openai.py": "client = OpenAI(key='" + "sk" + "-" + "Q" * 40 + "')\n",
        "conf.yaml": "api" + "_key: " + '"' + "s3cr3tvalue99" + '"\n',
        "home.md": "data lives in " + "/ho" + "me/alice/datasets/x\n",
        "mac.md": "see " + "/Us" + "ers/bob/project\n",
        "rootpath.md": "cache at " + "/ro" + "ot/.cache/hub\n",
        "work.md": "checkout at " + "/wo" + "rk/main/ledger\n",
        "host.log": "ran on gpu-node-17 yesterday\n",
    }
    for name, text in secrets.items():
        (root / name).write_text(text)
    clean = {
        "clean.md": "url https://example.com/home/alice/x and ~/notes and /tmp/x and gpu-node-170\n",
        "manifest.txt": "".join(f"train/mod{i}.py {'cd' * 32}\n" for i in range(30)),
        "code.py": "password = os.environ['PW']\napi_key = \"${API_KEY}\"\n",
        "tokens.json": json.dumps({"traceEvents_count": 0, "reward_mean": 0.5}),
    }
    for name, text in clean.items():
        (root / name).write_text(text)


EXPECTED = {
    "weights.dat": "checkpoint",
    "state.dat": "checkpoint",
    "tensor.dat": "checkpoint",
    "array.dat": "tensor",
    "model.pt": "checkpoint",
    "sample.dat": "image",
    "photo.jpg": "image",
    "profile.json": "profiler-trace",
    "run.nsys-rep": "profiler-trace",
    "rollout.jsonl": "reward-trace",
    "grpo_reward_trace.txt": "reward-trace",
    "listing.txt": "data-listing",
    "pem.txt": "credential",
    "aws.txt": "credential",
    "gh.txt": "credential",
    "ghpat.txt": "credential",
    "hf.txt": "credential",
    "wandb.sh": "credential",
    "openai.py": "credential",
    "conf.yaml": "credential",
    "home.md": "private-path",
    "mac.md": "private-path",
    "rootpath.md": "private-path",
    "work.md": "private-path",
    "host.log": "host-name",
}


def test_every_planted_kind_is_found_and_clean_files_pass(tmp_path: Path) -> None:
    _plant(tmp_path)
    findings, scanned = scan_paths([tmp_path], host_names=HOSTS)
    kinds = _kinds(findings)
    for name, kind in EXPECTED.items():
        assert kind in kinds.get(name, set()), f"{name}: expected {kind}, found {kinds.get(name)}"
    assert set(kinds) == set(EXPECTED), f"unexpected findings: {set(kinds) - set(EXPECTED)}"
    assert scanned == len(EXPECTED) + 5  # + docs/figure.png and the four clean files


def test_secrets_are_not_echoed_and_lines_are_exact(tmp_path: Path) -> None:
    token = "gh" + "p_" + "Z9y8" * 9
    (tmp_path / "notes.md").write_text("line one\nline two\nmy token " + token + "\n")
    findings, _ = scan_paths([tmp_path], host_names=[])
    assert [f.line for f in findings] == [3]
    assert token not in findings[0].text() and "redacted" in findings[0].text()
    assert findings[0].text().startswith(str(tmp_path / "notes.md") + ":3: credential: GitHub token")


def test_git_tree_is_scanned_as_git_would_commit_it(tmp_path: Path) -> None:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("ignored/\n")
    (tmp_path / "ignored").mkdir()
    (tmp_path / "ignored" / "ckpt.pt").write_bytes(b"\x80\x04x")
    (tmp_path / "kept.pt").write_bytes(b"\x80\x04x")
    findings, _ = scan_paths([tmp_path], host_names=[])
    assert [Path(f.path).name for f in findings] == ["kept.pt"]
    # a directory git ignores is scanned whole when named, e.g. a run directory
    findings, _ = scan_paths([tmp_path / "ignored"], host_names=[])
    assert [Path(f.path).name for f in findings] == ["ckpt.pt"]


def test_this_host_names_skip_tiny_and_generic(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCH_HYGIENE_HOSTS", "build-box-3,lo,localhost")
    names = this_host_names()
    assert "build-box-3" in names and "lo" not in names and "localhost" not in names
    assert all(len(n) >= 4 for n in names)


def _orch(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return orch(*args, cwd=cwd)  # in this process (tests/cliutil.py): same entry point, no new interpreter


def test_cli_fails_naming_token_checkpoint_and_home_path(tmp_path: Path, repo: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "cfg.env").write_text("HF=" + "hf" + "_" + "Qw3" * 12 + "\n")
    (tmp_path / "a" / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00" + b'{"a":1}' + b" " * 9)
    (tmp_path / "paths.md").write_text("at " + "/ho" + "me/carol/run\n")
    proc = _orch("hygiene", str(tmp_path / "a"), str(tmp_path / "paths.md"), cwd=repo)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert any("cfg.env:1: credential: Hugging Face token" in line for line in lines)
    assert any("model.safetensors:1: checkpoint:" in line for line in lines)
    assert any("paths.md:1: private-path:" in line for line in lines)
    assert "3 finding(s)" in proc.stderr


def test_cli_passes_over_the_repository(repo: Path) -> None:
    proc = _orch("hygiene", str(repo), cwd=repo)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "nothing found" in proc.stdout


@pytest.mark.parametrize("kind", ["a", "b", "p", "r", "s"])
def test_a_slack_token_is_a_credential(kind: str) -> None:
    from ledger.files.hygiene import scan_text

    token = "xox" + kind + "-" + "1234567890-abcdefABCDEF"  # assembled, so this file passes hygiene itself
    found = scan_text("cfg.env", f"SLACK={token}\n", [])
    assert [(f.line, f.kind) for f in found] == [(1, "credential")]
    assert found[0].detail.startswith("Slack token: ") and token not in found[0].detail


@pytest.mark.parametrize("text", ["xox" + "q-1234567890-abcdef", "xox" + "b-12345678", "axox" + "b-1234567890abc"])
def test_what_only_resembles_a_slack_token_is_not_a_credential(text: str) -> None:
    from ledger.files.hygiene import scan_text

    assert scan_text("cfg.env", f"SLACK={text}\n", []) == []
