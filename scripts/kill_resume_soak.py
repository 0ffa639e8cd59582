"""Soak test of crash safety: SIGKILL a training run at random moments, resume it each time, compare the end.

    python scripts/kill_resume_soak.py [--kills 20] [--steps 150] [--seed 0] [--out /tmp/soak]

1. An uninterrupted reference run of the tiny demo config.
2. The same config started, killed with SIGKILL after a random delay, and resumed with `--resume auto`, `--kills`
   times, each kill at a random moment after the run wrote a fresh checkpoint (so kills land mid-step or
   mid-save, not during start-up); before each resume every
   checkpoint folder that looks complete is verified against its manifest; then it runs to the end.
3. The final trainable weights of both runs are compared bit for bit.
Prints: `kills: 20, corrupt checkpoints: 0, final weights identical: yes`. Exit status 1 if not identical/clean.
"""

from __future__ import annotations

import argparse
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from grpo import checkpoint as ckpt  # noqa: E402

TINY = ["--model.tiny_hidden", "32", "--model.tiny_layers", "1", "--model.tiny_heads", "2", "--data.demo_size", "40",
        "--data.eval_size", "4", "--rollout.max_new_tokens", "6", "--sft.steps", "4", "--train.eval_every", "0",
        "--train.tensorboard", "false", "--checkpoint.every", "1", "--train.lr", "1e-3"]


def command(out: Path, name: str, steps: int, seed: int, resume: bool) -> list[str]:
    cmd = [sys.executable, str(ROOT / "grpo_train.py"), "--output-dir", str(out), "--run-name", name,
           "--max-steps", str(steps), "--seed", str(seed), *TINY]
    return cmd + (["--resume", "auto"] if resume else [])


def _newest_step(run_dir: Path) -> int:
    folders = ckpt.list_complete(run_dir) if run_dir.exists() else []
    return int(folders[-1].name[len(ckpt.PREFIX):]) if folders else -1


def final_weights(run_dir: Path) -> dict:
    state, _ = ckpt.load(ckpt.find_resumable(run_dir))
    return state["weights"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="/tmp/grpo_soak")
    parser.add_argument("--max-delay", type=float, default=2.0,
                        help="longest wait after a fresh checkpoint before the kill, seconds")
    args = parser.parse_args()
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    rng = random.Random(args.seed)

    print("reference run (uninterrupted) ...", flush=True)
    subprocess.run(command(out, "reference", args.steps, args.seed, False), check=True, capture_output=True)
    reference = final_weights(out / "reference")

    kills = corrupt = 0
    run_dir = out / "soak"
    while kills < args.kills:
        has_ckpt = bool(ckpt.list_complete(run_dir))
        if not has_ckpt:
            shutil.rmtree(run_dir, ignore_errors=True)
        for folder in ckpt.list_complete(run_dir):
            try:
                ckpt.verify(folder)
            except ckpt.CheckpointError as e:
                corrupt += 1
                print(f"  corrupt: {e}", flush=True)
        before = _newest_step(run_dir)
        proc = subprocess.Popen(command(out, "soak", args.steps, args.seed, has_ckpt), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        # Let the run get past start-up and write at least one new checkpoint, so every kill lands in training
        # (mid-step or mid-save) rather than in the imports; then kill at a random moment.
        deadline = time.time() + 300
        while time.time() < deadline and proc.poll() is None and _newest_step(run_dir) <= before:
            time.sleep(0.05)
        delay = rng.uniform(0.0, args.max_delay)
        time.sleep(delay)
        if proc.poll() is not None:
            print(f"  run finished before kill {kills + 1}; raise --steps", flush=True)
            break
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        kills += 1
        newest = ckpt.find_resumable(run_dir) if run_dir.exists() else None
        print(f"  kill {kills:2d} {delay:4.2f}s after checkpoint step {_newest_step(run_dir) if newest else 0}; "
              f"newest complete: {newest.name if newest else 'none'}", flush=True)
    subprocess.run(command(out, "soak", args.steps, args.seed, bool(ckpt.list_complete(run_dir))), check=True,
                   capture_output=True)
    soak = final_weights(run_dir)
    identical = soak.keys() == reference.keys() and all(
        soak[k].shape == reference[k].shape and bool((soak[k] == reference[k]).all()) for k in soak)
    print(f"kills: {kills}, corrupt checkpoints: {corrupt}, final weights identical: {'yes' if identical else 'no'}")
    return 0 if identical and corrupt == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
