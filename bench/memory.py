"""Peak RSS of whole CLI commands on the cpu backend, measured with `/usr/bin/time -v` (one process each).

    python bench/memory.py [transcribe] [phases] [long] [embed-text] [classify VIT_FOLDER]
(default: transcribe long embed-text)
`transcribe`: the 7.1 s Austen clip (LibriVox, Debian's pocketsphinx-testdata) with tiny.en; `phases`: the same
transcription in one process, phase by phase, with each phase's own high-water mark (which phase sets the peak);
`long`: a 2-hour 48 kHz stereo WAV made from it with sox (padded to 17.1 s, 420 copies: 7182 s), the #26 target
(< 500 MB); `embed-text`: 1000 lines through all-MiniLM-L6-v2; `classify`: skimage's astronaut through a ViT folder
(no ViT weights are offline: e.g. a random-init ViTForImageClassification saved with save_pretrained).
Needs sox and GNU time (Debian `sox time`).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

CLIP = Path("/usr/share/pocketsphinx/test/data/librivox/sense_and_sensibility_01_austen_64kb-0870.wav")
ROOT = Path(__file__).resolve().parent.parent


def peak_rss(args: list[str], stdin: bytes | None = None) -> tuple[float, float, str]:
    """(peak RSS in MB, wall seconds, stdout) of `aie-apps ARGS` run under /usr/bin/time -v."""
    env = os.environ | {"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    run = subprocess.run(["/usr/bin/time", "-v", sys.executable, "-m", "apps.main", *args, "--device", "cpu"],
                         input=stdin, capture_output=True, env=env, check=True)
    report = run.stderr.decode()
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", report).group(1)) / 1024
    h, m, s = ([0.0] * 3 + [float(x) for x in re.search(r"Elapsed .*: ([\d:.]+)", report).group(1).split(":")])[-3:]
    return rss, 3600 * h + 60 * m + s, run.stdout.decode()


PHASES = """
import sys, time
def mark(phase, since):
    status = dict(line.split(":", 1) for line in open("/proc/self/status"))
    mb = {k: int(status[k].split()[0]) // 1024 for k in ("VmRSS", "VmHWM")}
    seconds = time.perf_counter() - since
    print(f"  {phase:26s} RSS {mb['VmRSS']:4d} MB, peak within {mb['VmHWM']:4d} MB ({seconds:.1f} s)")
    open("/proc/self/clear_refs", "w").write("5")  # the next phase's high-water mark starts from its RSS
    return time.perf_counter()
t = time.perf_counter()
from pipelines.asr import WhisperRecognizer
t = mark("imports", t)
r = WhisperRecognizer(device="cpu")
t = mark("recognizer (load, session)", t)
for n in ("first", "second"):
    r.transcribe(sys.argv[1])
    t = mark(f"{n} transcription", t)
"""


def phases(clip: Path):
    """RSS and each phase's own peak of a tiny.en transcription of `clip`, in a fresh process."""
    env = os.environ | {"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    print(subprocess.run([sys.executable, "-c", PHASES, str(clip)], capture_output=True, env=env, check=True,
                         text=True).stdout, end="")


def long_wav(folder: Path) -> Path:
    padded, out = folder / "clip48.wav", folder / "long.wav"
    subprocess.run(["sox", str(CLIP), "-r", "48000", "-c", "2", str(padded), "pad", "0", "10"], check=True)
    subprocess.run(["sox", str(padded), str(out), "repeat", "419"], check=True)
    return out


def main():
    which = sys.argv[1:] or ["transcribe", "long", "embed-text"]
    print(f"  load: {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory() as tmp:
        if "transcribe" in which:
            rss, wall, _ = peak_rss(["transcribe", str(CLIP)])
            print(f"  transcribe 7.1 s clip: peak RSS {rss:.0f} MB ({wall:.1f} s)")
        if "phases" in which:
            print("  transcribe 7.1 s clip, phase by phase:")
            phases(CLIP)
        if "long" in which:
            rss, wall, text = peak_rss(["transcribe", str(long_wav(Path(tmp)))])
            print(f"  transcribe 2-hour 48 kHz stereo: peak RSS {rss:.0f} MB ({wall:.0f} s; "
                  f"'John Dashwood' {text.count('John Dashwood')} of 420 copies)")
        if "embed-text" in which:
            lines = "".join(f"Sentence number {i} is about a man eating food.\n" for i in range(1000)).encode()
            rss, wall, _ = peak_rss(["embed-text"], stdin=lines)
            print(f"  embed-text 1000 lines: peak RSS {rss:.0f} MB ({wall:.1f} s)")
        if "classify" in which:
            folder = sys.argv[sys.argv.index("classify") + 1]
            image = Path(__import__("skimage").__file__).parent / "data" / "astronaut.png"
            rss, wall, _ = peak_rss(["classify", str(image), "--json", "--headless", "--model", folder])
            print(f"  classify one image ({Path(folder).name}): peak RSS {rss:.0f} MB ({wall:.1f} s)")
    print(f"  load: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
