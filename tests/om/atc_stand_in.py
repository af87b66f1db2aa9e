"""A stand-in `atc` executable for the ATC path: no CANN on these machines; and what the tests of
how its builds end look at (a process alive, dot-files left in a folder)."""
import textwrap


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper is not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


def leftovers(folder) -> list[str]:
    """The hidden entries of `folder`: a build's work folders and partial files."""
    return [p.name for p in folder.iterdir() if p.name.startswith(".")]

# The stand-in: records argv/cwd/pid, prints like ATC, then acts per FAKE_ATC_MODE (os_specific:
# writes <output>_linux_<machine>.om, as ATC does for a model carrying its operators' code).
FAKE_ATC = textwrap.dedent("""\
    #!{python}
    import json, os, re, struct, subprocess, sys, time
    args = sys.argv[1:]
    mode = os.environ.get("FAKE_ATC_MODE", "ok")
    for a in args:  # ATC checks its paths, symlinks resolved, for characters (E10001)
        if a.startswith(("--model=", "--output=")):
            if re.search(r"[^A-Za-z0-9./_\\-\u4e00-\u9fa5]", os.path.realpath(a.split("=", 1)[1])):
                print("E10001: Value for parameter is invalid. The path can only contain 'a-z' 'A-Z' '0-9' "
                      "'-' '.' '_' and Chinese characters.", flush=True)
                sys.exit(1)
    conf = [a.split("=", 1)[1] for a in args if a.startswith("--insert_op_conf=")]
    conf_text = open(conf[0]).read() if conf else None  # the work folder is gone after the run
    helper = None
    if mode == "sleep_with_helper":  # a process of its own, as ATC's operator compiles are
        helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]).pid
    with open(os.environ["FAKE_ATC_RECORD"], "w") as f:
        json.dump({{"argv": args, "cwd": os.getcwd(), "pid": os.getpid(), "insert_op_conf": conf_text,
                   "helper": helper}}, f)
    print("ATC start working now, please wait for a moment.", flush=True)
    if mode in ("sleep", "sleep_with_helper"):
        time.sleep(600)
    if mode == "gate":  # finish only after the test saw the first line: proves streaming
        print("waiting for the gate", flush=True)
        while not os.path.exists(os.environ["FAKE_ATC_GATE"]):
            time.sleep(0.01)
    if mode == "fail":
        print("[INFO] parsing model", flush=True)
        print("E10001: Value [x:-1,4] for parameter [--input_shape] is invalid.", flush=True)
        print("ATC run failed, Please check the detail log, Try 'atc --help' for more information", flush=True)
        sys.exit(1)
    out = [a.split("=", 1)[1] for a in args if a.startswith("--output=")][0]
    if mode == "os_specific":  # the name ATC gives the OM of a model carrying its operators' code
        out += "_linux_" + os.uname().machine
    if mode != "nofile":
        payload = b"partition table and weights" * 10
        head = bytearray(256)
        head[0:4] = b"IMOD"
        struct.pack_into("<II", head, 4, 256, 0x20000000)
        struct.pack_into("<I", head, 76, len(payload) if mode != "truncated" else len(payload) + 100)
        head[82] = 1
        name = os.path.basename(out).encode()[:32]  # (the header's field: bytes 84-115)
        head[84:84 + len(name)] = name
        head[160:168] = b"7.6.0.1\\0"
        head[193] = 0  # is_unknow_model: batch gears are not an unknown shape (ATC: set only for those)
        with open(os.open(out + ".om", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:  # ATC: 0600
            junk = b"no OM header " * 30  # (longer than an OM's header)
            f.write(b"" if mode == "empty" else junk if mode == "junk" else bytes(head) + payload)
    print("ATC run success, welcome to the next use.", flush=True)
""")
