"""Does a CUDA program run inside a package's namespace (read-only root, minimal /dev, PID and IPC namespaces)?

Runs one real `checks` package through orchestrator.isolation.packages.run_package with the default isolation; its
prepare command allocates on the GPU, adds, and synchronizes. Prints the isolation mode that held, the package's status
and the command's output; exit 0 only when the mode is namespace and the package is ok.

Usage: python bench/cuda_namespace_check.py [--device cuda|cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from orchestrator.isolation.package_isolation import namespaces_work  # noqa: E402
from orchestrator.isolation.packages import package_env, run_package  # noqa: E402
from protocol.package import ChecksSpec  # noqa: E402

PROGRAM = ("import torch; d = '{device}'; x = torch.arange(1 << 20, device=d, dtype=torch.float32); "
           "y = (x * 2).sum(); torch.cuda.synchronize() if d == 'cuda' else None; "
           "print('sum', float(y), 'on', torch.cuda.get_device_name() if d == 'cuda' else 'cpu')")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    opts = ap.parse_args()
    print("namespaces work here:", namespaces_work())
    with tempfile.TemporaryDirectory(prefix="orch-ns-cuda-") as tmp:
        t = Path(tmp)
        pkg = t / "home" / "runs" / "r1" / "packages" / "checks"
        pkg.mkdir(parents=True)
        (t / "home" / "scratch" / "r1").mkdir(parents=True)
        spec = ChecksSpec.model_validate({
            "run_id": "r1", "name": "checks", "kind": "checks", "package_dir": str(pkg), "sealed_dir": str(t),
            "scratch_dir": str(t / "home" / "scratch" / "r1"), "result_path": str(pkg / "result.json"),
            "device": opts.device, "precision": "fp32",
            "prepare": [{"name": "cuda", "argv": [sys.executable, "-c", PROGRAM.format(device=opts.device)]}],
        })
        path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
        env = package_env({**os.environ, "PYTHONPATH": path}, {}, {}, {}, "r1")
        outcome = run_package(spec, env, 300)
        print("isolation:", outcome.extra.get("isolation"), "| ending:", outcome.extra.get("ending"),
              "| network:", outcome.extra.get("network"))
        print("status:", outcome.status, "| exit:", outcome.exit_code, "| note:", outcome.note)
        result = pkg / "result.json"
        if result.is_file():
            print(json.dumps(json.loads(result.read_text()), indent=1)[:2000])
        for log in sorted((t / "home" / "scratch" / "r1").rglob("*.log")):
            print(f"--- {log.name}\n{log.read_text()[-1500:]}")
        return 0 if outcome.status == "ok" and outcome.extra.get("isolation") == "namespace" else 1


if __name__ == "__main__":
    sys.exit(main())
