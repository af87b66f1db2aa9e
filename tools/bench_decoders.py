#!/usr/bin/env python3
"""Compare image decoders for aclserve's image inputs: decode JPEG/PNG bytes to RGB uint8 and
resize to the model's H x W (antialiased), images/s on one thread and on two (GIL release).

Candidates (each measured in its own process, only if it imports):
  pillow        Pillow, full decode + Image.resize(BILINEAR, antialiased)
  pillow-draft  Pillow with JPEG DCT-domain downscaling (Image.draft) before the resize
  pillow-simd   Pillow-SIMD (pass --pillow-simd DIR: a `pip install --target DIR pillow-simd`)
  simplejpeg    simplejpeg (libjpeg-turbo) decode, DCT downscale, Pillow resize; PNG via Pillow
  turbojpeg     PyTurboJPEG (libturbojpeg) decode with scaling factor, Pillow resize; PNG via Pillow
  opencv        opencv-python-headless cv2.imdecode + cv2.resize(INTER_AREA)

Images: scikit-learn's two sample photos (427x640, re-encoded as JPEG q90 and PNG) and the same
upscaled to 1280x853; falls back to a synthetic picture without scikit-learn.
A run that measured no candidate says so and exits 1; Ctrl-C or SIGTERM stop the candidate being
measured, exit 130 (tools/bench_run.py).
Usage: python tools/bench_decoders.py [--size 224] [--seconds 1] [--pillow-simd DIR]
"""
from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_args import positive_float, positive_int  # noqa: E402
from bench_run import BenchFailed, run_tool  # noqa: E402

CANDIDATES = ("pillow", "pillow-draft", "pillow-simd", "simplejpeg", "turbojpeg", "opencv")


def sample_images() -> dict[str, list[bytes]]:
    from PIL import Image
    try:
        from sklearn.datasets import load_sample_image
        photos = [load_sample_image(n) for n in ("china.jpg", "flower.jpg")]
    except ImportError:
        yy, xx = np.mgrid[0:427, 0:640]
        rng = np.random.default_rng(0)
        photos = [np.stack([(xx * 0.4) % 256, (yy * 0.6) % 256, rng.integers(0, 256, yy.shape)], -1).astype(np.uint8)]
    out: dict[str, list[bytes]] = {}
    for label, scale in (("640x427", 1), ("1280x853", 2)):
        for fmt, kw in (("jpeg", {"quality": 90}), ("png", {})):
            blobs = []
            for p in photos:
                im = Image.fromarray(p)
                if scale != 1:
                    im = im.resize((im.width * scale, im.height * scale), Image.BICUBIC)
                buf = io.BytesIO()
                im.save(buf, format=fmt.upper(), **kw)
                blobs.append(buf.getvalue())
            out[f"{fmt} {label}"] = blobs
    return out


def _check_simd() -> None:
    """--pillow-simd DIR only puts DIR first on the path: a DIR without Pillow-SIMD (a failed
    `pip install --target`) measured the ordinary Pillow under its name."""
    import PIL
    where = os.environ.get("PYTHONPATH", "").split(os.pathsep)[0]
    if not where or not os.path.abspath(PIL.__file__).startswith(os.path.abspath(where) + os.sep):
        raise SystemExit(f"Pillow-SIMD is not installed in {where or '(no folder)'}: PIL {PIL.__version__} "
                         f"came from {os.path.dirname(os.path.dirname(PIL.__file__))}")


def make_decoder(name: str, size: int):
    """A function bytes -> uint8 [size, size, 3] RGB for `name`."""
    from PIL import Image

    def pil_resize(im):
        return np.asarray(im.convert("RGB").resize((size, size), Image.BILINEAR))

    def pil(data):
        return pil_resize(Image.open(io.BytesIO(data)))

    if name == "pillow-simd":
        _check_simd()
    if name in ("pillow", "pillow-simd"):
        return pil
    if name == "pillow-draft":
        def draft(data):
            im = Image.open(io.BytesIO(data))
            if im.format == "JPEG":
                im.draft("RGB", (size, size))  # DCT scaling to the smallest 1/2^k not below size
            return pil_resize(im)
        return draft
    if name == "simplejpeg":
        import simplejpeg

        def sj(data):
            if data[:2] != b"\xff\xd8":
                return pil(data)
            arr = simplejpeg.decode_jpeg(data, colorspace="RGB", min_height=size, min_width=size)
            return pil_resize(Image.fromarray(arr))
        return sj
    if name == "turbojpeg":
        import turbojpeg
        tj = turbojpeg.TurboJPEG()

        def tjd(data):
            if data[:2] != b"\xff\xd8":
                return pil(data)
            w, h, _, _ = tj.decode_header(data)
            factor = (1, 1)
            for num, den in sorted(tj.scaling_factors, key=lambda f: f[0] / f[1]):
                if w * num // den >= size and h * num // den >= size:
                    factor = (num, den)
                    break
            arr = tj.decode(data, pixel_format=turbojpeg.TJPF_RGB, scaling_factor=factor)
            return pil_resize(Image.fromarray(arr))
        return tjd
    if name == "opencv":
        import cv2
        cv2.setNumThreads(1)

        def cvd(data):
            arr = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
            return cv2.cvtColor(cv2.resize(arr, (size, size), interpolation=cv2.INTER_AREA), cv2.COLOR_BGR2RGB)
        return cvd
    raise ValueError(name)


def rate(fn, blobs: list[bytes], seconds: float, threads: int, repeats: int = 3) -> float:
    """Best images/s of `repeats` runs of about `seconds` each, `threads` workers decoding
    concurrently (best-of, because a shared machine only ever makes a run slower)."""
    return max(_rate(fn, blobs, seconds, threads) for _ in range(repeats))


def _rate(fn, blobs: list[bytes], seconds: float, threads: int) -> float:
    for b in blobs:
        fn(b)  # warm up
    count = max(4, int(seconds * 50))
    while True:
        work = [blobs[i % len(blobs)] for i in range(count)]
        start = time.perf_counter()
        if threads == 1:
            for b in work:
                fn(b)
        else:
            with ThreadPoolExecutor(threads) as pool:
                list(pool.map(fn, work, chunksize=4))
        took = time.perf_counter() - start
        if took >= seconds * 0.5 or count > 200000:
            return count / took
        count = int(count * seconds / max(took, 1e-3)) + 1


def measure(name: str, size: int, seconds: float) -> dict:
    fn = make_decoder(name, size)
    images = sample_images()
    result = {}
    for label, blobs in images.items():
        result[label] = [rate(fn, blobs, seconds, 1), rate(fn, blobs, seconds, 2)]
    return result


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=positive_int, default=224, help="resize target, square (default %(default)s)")
    parser.add_argument("--seconds", type=positive_float, default=1.0,
                        help="per measurement, best of 3, 2 thread counts and 4 image sets each (default %(default)g)")
    parser.add_argument("--pillow-simd", metavar="DIR",
                        help="folder with Pillow-SIMD installed (--target; default: pillow-simd not measured)")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    # a SIGTERM or a Ctrl-C unwinds the run: subprocess.run kills the candidate's process it waits for
    # (a SIGTERM's default action ended this process alone and left that one running, ~30 s)
    return run_tool("bench_decoders", lambda: run(args), cleaned="its measuring process stopped")


def run(args) -> int:
    if args.one:
        print(json.dumps(measure(args.one, args.size, args.seconds)))
        return 0
    rows = {}
    for name in CANDIDATES:
        env = dict(os.environ)
        if name == "pillow-simd":
            if not args.pillow_simd:
                continue
            env["PYTHONPATH"] = args.pillow_simd + os.pathsep + env.get("PYTHONPATH", "")
        proc = subprocess.run([sys.executable, __file__, "--one", name, "--size", str(args.size),
                               "--seconds", repr(args.seconds)], env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            print(f"{name}: not measured ({proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else 'failed'})")
            continue
        rows[name] = json.loads(proc.stdout)
    if not rows:  # (an empty table, exit 0, read as a run)
        raise BenchFailed("no decoder was measured (each one's reason above)")
    labels = list(next(iter(rows.values())).keys())
    print(f"decode + resize to {args.size}x{args.size} RGB, images/s (1 thread / 2 threads)")
    print("| decoder | " + " | ".join(labels) + " |")
    print("|---|" + "---:|" * len(labels))
    for name, r in rows.items():
        print(f"| {name} | " + " | ".join(f"{r[k][0]:,.0f} / {r[k][1]:,.0f}" for k in labels) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
