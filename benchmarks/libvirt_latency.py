"""Latency of the libvirt backend on a real VM (the image from `make vm-image`).

Prints the image's build time and size (vm_images/build.sh records them in build-info.json beside it), then
boots one LibvirtDesktop (qemu:///system; domain type qemu = TCG unless --domain-type kvm) and prints:
boot-to-ready (domain start -> guest agent ping -> `wmctrl -m` passing in the guest, i.e. X and openbox up),
the ready snapshot's save time, reset (snapshot revert until the agent answers) p50, screenshot p50
(virDomainScreenshot + PNG/PPM decode) and step p50 (one input action + one screenshot). Optionally starts
an app in the guest and saves a screenshot of it. Run it with `nice`; the domain is removed at the end.

`--env TASK` measures the gym env instead (CodaEnv(app="kalgebra", backend="libvirt")): the first reset
(boot, KAlgebra started and ready, its snapshot saved), reset p50 (a revert to that snapshot), step p50 (a
click, the screen settling, the observation) and the DONE step's p50 (KAlgebra's state read in the guest
and the task's checks), plus the oracle's reward.

Usage: python benchmarks/libvirt_latency.py --image vm_images/build/coda-debian12.qcow2
       [--domain-xml vm_images/build/domain.xml] [--resets 3] [--shots 20] [--steps 20]
       [--app kalgebra --type "x:=2+3\\n" --png /tmp/kalgebra-vm.png]
       python benchmarks/libvirt_latency.py --image ... --env calc_power [--resets 5] [--steps 10]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from coda_env.actions import Action
from coda_env.backends.libvirt import LibvirtConfig, LibvirtDesktop


def p50(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--image", default="vm_images/build/coda-debian12.qcow2")
    ap.add_argument("--domain-xml", default=None, help="default: domain.xml beside the image")
    ap.add_argument("--uri", default="qemu:///system")
    ap.add_argument("--domain-type", default="qemu")
    ap.add_argument("--memory-mib", type=int, default=2048)
    ap.add_argument("--vcpus", type=int, default=2)
    ap.add_argument("--resets", type=int, default=3)
    ap.add_argument("--shots", type=int, default=20)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--app", default=None, help="a program to start in the guest after the resets")
    ap.add_argument("--app-window", default=None, help="wmctrl class to wait for (default: --app)")
    ap.add_argument("--type", default=None, help="text to type into the app once it painted (\\n: enter)")
    ap.add_argument("--png", default=None, help="save the last screenshot here")
    ap.add_argument("--env", default=None, metavar="TASK", help="measure CodaEnv on this KAlgebra task")
    args = ap.parse_args()

    image = os.path.abspath(args.image)
    xml = args.domain_xml  # None: the backend takes the domain.xml beside the image
    print_build_info(image)
    if args.env:
        return env_figures(args, image, xml)
    cfg = LibvirtConfig(
        uri=args.uri,
        base_image=image,
        domain_xml=xml,
        domain_type=args.domain_type,
        memory_mib=args.memory_mib,
        vcpus=args.vcpus,
    )
    d = LibvirtDesktop(cfg)
    t0 = time.monotonic()
    try:
        d.start()
        total = time.monotonic() - t0
        t = d.timings
        print(f"start total        {total:7.1f} s (overlay + define + boot + ready + snapshot)")
        print(f"  domain create    {t.get('boot', 0):7.2f} s")
        print(f"  -> agent ping    {t.get('agent', 0):7.1f} s after the domain started")
        print(f"  -> desktop ready {t.get('desktop', 0):7.1f} s after the domain started (wmctrl -m)")
        print(f"  snapshot save    {t.get('snapshot', 0):7.1f} s")
        resets = []
        for _ in range(args.resets):
            d.reset()
            resets.append(d.timings["revert"])
        print(f"reset p50          {p50(resets):7.2f} s  (n={len(resets)}: {', '.join(f'{r:.2f}' for r in resets)})")
        shots = []
        for _ in range(args.shots):
            s = time.monotonic()
            img = d.screenshot()
            shots.append(time.monotonic() - s)
        print(f"screenshot p50     {p50(shots) * 1000:7.1f} ms (n={len(shots)}, {img.shape[1]}x{img.shape[0]})")
        steps = []
        for i in range(args.steps):
            a = Action("click", x=100 + 10 * i, y=100) if i % 2 == 0 else Action("press", keys=["shift"])
            s = time.monotonic()
            d.input(a)
            img = d.screenshot()
            steps.append(time.monotonic() - s)
        print(f"step p50           {p50(steps) * 1000:7.1f} ms (n={len(steps)}; click or key press + screenshot)")
        if args.app:
            want = (args.app_window or os.path.basename(args.app)).lower()
            s = time.monotonic()
            d.spawn([args.app], env={"QTWEBENGINE_DISABLE_SANDBOX": "1"}, log="/tmp/coda-app.log")
            deadline = s + 300
            found = []
            while time.monotonic() < deadline:
                found = [w for w in d.windows() if want in w.wm_class.lower() or want in w.title.lower()]
                if found:
                    break
                time.sleep(0.5)
            if found:
                print(f"{args.app} window  {time.monotonic() - s:7.1f} s to map: {found[0]}")
            else:
                log = d.run(["tail", "-20", "/tmp/coda-app.log"]).stdout.decode(errors="replace")
                print(f"{args.app}: no window within 300 s; its log:\n{log}")
            img = d.screenshot()
            if found:  # wait until it has painted: its window no longer one flat colour (120 s at most)
                w = found[0]
                until = time.monotonic() + 120
                while time.monotonic() < until:
                    inner = img[w.y + 30 : w.y + w.height, w.x : w.x + w.width]
                    if inner.size and inner.reshape(-1, 3).std(axis=0).max() > 8:
                        print(f"{args.app} painted {time.monotonic() - s:7.1f} s after spawn")
                        break
                    time.sleep(0.5)
                    img = d.screenshot()
                else:
                    log = d.run(["tail", "-20", "/tmp/coda-app.log"]).stdout.decode(errors="replace")
                    print(f"{args.app}: its window stayed one flat colour for 120 s; its log:\n{log}")
        if args.app and args.type:
            text = args.type.replace("\\n", "\n")
            s = time.monotonic()
            d.input(Action("type", text=text))
            typed = time.monotonic() - s
            before, until = img, time.monotonic() + 60  # poll until the screen changed and then held still
            while time.monotonic() < until:
                time.sleep(0.3)
                nxt = d.screenshot()
                if (nxt != before).any() and (nxt == img).all():
                    break
                img = nxt
            print(f"typed {len(text)} keys in {typed:.2f} s; screen settled {time.monotonic() - s:.1f} s after")
        if args.png:
            from PIL import Image

            Image.fromarray(img).save(args.png)
            print(f"saved {args.png}")
    finally:
        d.stop()


def print_build_info(image: str) -> None:
    """The image's build time and size, as vm_images/build.sh recorded them beside it."""
    path = os.path.join(os.path.dirname(image), "build-info.json")
    try:
        with open(path) as f:
            info = json.load(f)
    except (OSError, ValueError):
        print(f"image build        (no {path}: the image was not built by vm_images/build.sh)")
        return
    print(
        f"image build        {info['seconds'] / 60:7.1f} min, {info['image_bytes'] / 2**30:.2f} GiB qcow2 "
        f"(apps: {info['apps']}; built {info['built']})"
    )


def env_figures(args: argparse.Namespace, image: str, xml: str | None) -> None:
    from coda_env.env import CodaEnv

    env = CodaEnv(
        app="kalgebra",
        backend="libvirt",
        backend_options=dict(
            uri=args.uri,
            base_image=image,
            domain_xml=xml,
            domain_type=args.domain_type,
            memory_mib=args.memory_mib,
            vcpus=args.vcpus,
        ),
    )
    try:
        task = env.unwrapped.tasks[args.env]
        s = time.monotonic()
        env.reset(options={"task": task.id})
        t = env.desktop.timings
        print(
            f"first reset        {time.monotonic() - s:7.1f} s (boot {t['desktop']:.1f} s to the desktop, a11y "
            f"{t.get('a11y', 0):.1f} s, snapshot {t['snapshot']:.1f} s, KAlgebra ready "
            f"{env.timings['launch']:.1f} s incl. its snapshot {t.get('checkpoint', 0):.1f} s)"
        )
        reward = 0.0
        for action in task.solution:
            _, reward, term, trunc, info = env.step(action)
            if term or trunc:
                break
        print(f"oracle reward      {reward:7.1f}   ({task.id}, {len(task.solution)} steps)")
        resets, steps, dones = [], [], []
        for i in range(args.resets):
            s = time.monotonic()
            env.reset(options={"task": task.id})
            resets.append(time.monotonic() - s)
            for j in range(args.steps // max(1, args.resets)):
                s = time.monotonic()
                env.step(f"pyautogui.click({200 + 40 * j}, {300 + 20 * i})")
                steps.append(time.monotonic() - s)
            s = time.monotonic()
            _, r, *_ = env.step("DONE")
            dones.append(time.monotonic() - s)
        print(
            f"reset p50          {p50(resets):7.2f} s  (n={len(resets)}: {', '.join(f'{r:.2f}' for r in resets)}; "
            f"revert to KAlgebra's snapshot)"
        )
        print(f"step p50           {p50(steps) * 1000:7.0f} ms (n={len(steps)}; click + settle + observation)")
        print(f"DONE p50           {p50(dones):7.2f} s  (n={len(dones)}; KAlgebra's state read in the guest + checks)")
    finally:
        env.close()


if __name__ == "__main__":
    main()
