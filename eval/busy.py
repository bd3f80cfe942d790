"""Run a command beside a bounded background load: how the methods hold up on a shared machine.

    python eval/busy.py --cores 1 -- python eval/compare.py --quick --tasks code --out runs/compare/busy

Starts --cores processes that each keep one core busy (a spin loop), runs the command, then stops them
(also when the command fails or is interrupted), and exits with the command's exit code. compare.py then
sees the load (its busy-machine warning names it) and, with `--threads auto`, computes on the cores left.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

SPIN = "while True: pass"


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cores", type=int, default=1, help="cores to keep busy (default: %(default)s)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command to run, after --")
    args = p.parse_args(argv)
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    if not args.command:
        p.error("give the command to run after --, e.g. -- python eval/compare.py --quick")
    if not 1 <= args.cores <= (os.cpu_count() or 1):
        p.error(f"--cores must be between 1 and the {os.cpu_count()} cores of this machine, got {args.cores}")
    return args


def main(argv=None) -> int:
    args = parse(argv)
    load = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(args.cores)]
    print(f"background load: {args.cores} spinning process(es) (pids {', '.join(str(p.pid) for p in load)})",
          file=sys.stderr)
    try:
        return subprocess.call(args.command)
    except KeyboardInterrupt:
        return 130
    finally:
        for proc in load:
            proc.kill()
        for proc in load:
            proc.wait()


if __name__ == "__main__":
    raise SystemExit(main())
