"""Hardware profiles and nccl-tests logs are read as untrusted: each malformed
one gives one HardwareProfileError / ConfigError line naming the table and
key (or the log's line) at fault, and the CLI prints it with no traceback."""

import subprocess
import sys

import pytest

from prism_debug.cost import load_profile
from prism_debug.cost.calibrate import parse_nccl_tests
from prism_debug.cost.hardware import BUNDLED_DIR
from prism_debug.errors import ConfigError, HardwareProfileError

BASE = (BUNDLED_DIR / "h100-ib400.toml").read_text()
ADVICE = ": fix the file, or start from a bundled one (h100-ib400, zero)"
KEYS = "use name, description, gpus_per_node, sources, bandwidth_gbs, latency_us, " \
       "protocol_efficiency, scale, fit"


def edited(old: str, new: str) -> str:
    assert old in BASE
    return BASE.replace(old, new, 1)


def top_level(line: str, cut_from: str | None = None, cut_to: str | None = None) -> str:
    """BASE with ``line`` among its top-level keys, and the text from
    ``cut_from`` up to ``cut_to`` (the table or list it replaces) left out."""
    text = BASE
    if cut_from is not None:
        text = text[:text.index(cut_from)] + text[text.index(cut_to):]
    return text.replace("gpus_per_node = 8\n", f"gpus_per_node = 8\n{line}\n", 1)


PROFILES = [
    ("table-is-a-number", edited("[bandwidth_gbs]", "links = 3\n[bandwidth_gbs]"),
     f"unknown key links: {KEYS}"),
    ("section-of-wrong-type", top_level("bandwidth_gbs = 3", "[bandwidth_gbs]", "[latency_us]"),
     "[bandwidth_gbs] must be a mapping, got 3"),
    ("string-for-number", edited("nvlink = 370.0", 'nvlink = "370"'),
     "[bandwidth_gbs] nvlink must be a number, got '370'"),
    ("negative", edited("nic = 47.0", "nic = -47.0"), "[bandwidth_gbs] nic must be > 0, got -47.0"),
    ("nan-bandwidth", edited("nic = 47.0", "nic = nan"),
     "[bandwidth_gbs] nic must be a finite number or inf, got nan"),
    ("inf-latency", edited("nvls = 25.0", "nvls = inf"),
     "[latency_us] nvls must be a finite number, got inf"),
    ("nan-in-a-list", edited("base_ring = [6.6, 14.0, 8.4]", "base_ring = [6.6, nan, 8.4]"),
     "[latency_us] base_ring[1] must be a finite number, got nan"),
    ("short-list", edited("base_ring = [6.6, 14.0, 8.4]", "base_ring = [6.6]"),
     "[latency_us] base_ring must be a list of 3, got 1 items"),
    ("negative-latency", edited("net_tree = [5.0, 8.5, 14.0]", "net_tree = [5.0, -8.5, 14.0]"),
     "[latency_us] net_tree[1] must be >= 0, got -8.5"),
    ("fractional-gpus", edited("gpus_per_node = 8", "gpus_per_node = 8.5"),
     "gpus_per_node must be an integer, got 8.5"),
    ("bool-gpus", edited("gpus_per_node = 8", "gpus_per_node = true"),
     "gpus_per_node must be an integer, got True"),
    ("efficiency-above-one", edited("ll128 = 0.9375", "ll128 = 2.0"),
     "[protocol_efficiency] ll128 must be in (0, 1], got 2.0"),
    ("name-a-number", edited('name = "h100-ib400"', "name = 3"), "name must be a string, got 3"),
    ("sources-a-string", top_level('sources = "x"', "sources = [", "[bandwidth_gbs]"),
     "sources must be a list, got 'x'"),
    ("fit-fractional-ranks", BASE + "\n[fit.all_reduce]\nranks = 2.5\nlatency_us = 3\n"
                                    "busbw_gbs = 1\n",
     "[fit.all_reduce] ranks must be an integer, got 2.5"),
    ("fit-nan-latency", BASE + "\n[fit.send]\nranks = 2\nlatency_us = nan\nbusbw_gbs = 1\n",
     "[fit.send] latency_us must be a finite number, got nan"),
    ("fit-a-number", top_level("fit = 3"), "[fit] must be a mapping, got 3"),
    ("fit-unknown-key", BASE + "\n[fit.send]\nranks = 2\nlatency_us = 1\nbusbw_gbs = 1\n"
                               "busbw = 2\n",
     # (the error keys are calibrate's record of the fit's quality: accepted since issue 15)
     "unknown key [fit.send] busbw: use ranks, latency_us, busbw_gbs, knee_bytes, "
     "large_busbw_gbs, small_bytes, small_latency_us, median_error_pct, worst_error_pct, "
     "worst_error_bytes"),
    ("scale-loss-one", BASE + "\n[scale]\nnet_loss_per_doubling = 1.0\n",
     "[scale] net_loss_per_doubling must be in [0, 1), got 1.0"),
]


@pytest.mark.parametrize(("name", "text", "message"), PROFILES, ids=[p[0] for p in PROFILES])
def test_each_malformed_profile_gives_its_one_line(tmp_path, name, text, message):
    path = tmp_path / "hw.toml"
    path.write_text(text)
    with pytest.raises(HardwareProfileError) as caught:
        load_profile(str(path))
    assert str(caught.value) == f"hardware profile {path}: {message}{ADVICE}"


def test_a_profile_that_is_not_text_or_too_large_is_refused(tmp_path):
    path = tmp_path / "hw.toml"
    path.write_bytes(b"\xff\xfe" + BASE.encode())
    with pytest.raises(HardwareProfileError) as caught:
        load_profile(str(path))
    assert str(caught.value) == (f"cannot read hardware profile {path}: not UTF-8 text (invalid "
                                 "start byte at byte 0)")
    path.write_text("# " + "x" * (1 << 20) + "\n" + BASE)
    with pytest.raises(HardwareProfileError) as caught:
        load_profile(str(path))
    assert str(caught.value) == f"hardware profile {path} is larger than 1024 KiB: not a profile"


def test_the_bundled_profiles_still_load():
    assert load_profile("h100-ib400").nic_bw == 47e9
    assert load_profile("zero").nic_bw == float("inf")  # inf: a free link, allowed there


def cli(*args):
    return subprocess.run([sys.executable, "-m", "prism_debug.cli", *args], capture_output=True,
                          text=True, timeout=120)


def test_the_cli_prints_a_bad_profile_as_one_line(tmp_path):
    path = tmp_path / "hw.toml"
    path.write_text(top_level("bandwidth_gbs = 3", "[bandwidth_gbs]", "[latency_us]"))
    out = cli("cost", "--hardware", str(path), "--op", "all_reduce", "--bytes", "1M",
              "--ranks", "8")
    assert (out.returncode, out.stdout) == (2, "")
    assert out.stderr == (f"prism-debug: error: hardware profile {path}: [bandwidth_gbs] must be "
                          f"a mapping, got 3{ADVICE}\n")


# -- nccl-tests logs ---------------------------------------------------------------------

HEAD = """#  Rank  0 Group  0 Pid   4123 on node-a device  0 [0x18] NVIDIA H100 80GB HBM3
#  Rank  1 Group  0 Pid   4123 on node-a device  1 [0x2a] NVIDIA H100 80GB HBM3
#       size         count      type   redop    root     time   algbw   busbw #wrong     time
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)
"""
ROW = "     1048576        262144     float     sum      -1    42.00   24.97   43.69      0    41.5"


@pytest.mark.parametrize(("row", "message"), [
    (ROW.replace("42.00", "N/A"),
     "the time of 1048576 bytes is 'N/A', not a positive number of microseconds: rerun that "
     "size, or delete the line"),
    (ROW.replace("42.00", "nan"),
     "the time of 1048576 bytes is 'nan', not a positive number of microseconds: rerun that "
     "size, or delete the line"),
    (ROW.replace("42.00", "0.0"),
     "the time of 1048576 bytes is '0.0', not a positive number of microseconds: rerun that "
     "size, or delete the line"),
    (ROW.replace("42.00", "-3.0"),
     "the time of 1048576 bytes is '-3.0', not a positive number of microseconds: rerun that "
     "size, or delete the line"),
    (ROW.replace("     1048576", "9" * 5000),
     f"size {'9' * 5000} is not a message size in bytes (1 B to 1 PiB): give nccl-tests output "
     "as it printed it"),
    (ROW.replace("     1048576", "0"),
     "size 0 is not a message size in bytes (1 B to 1 PiB): give nccl-tests output as it "
     "printed it"),
])
def test_a_bad_result_row_names_its_line(row, message):
    with pytest.raises(ConfigError) as caught:
        parse_nccl_tests(HEAD + row + "\n", "all_reduce_perf.log")
    assert str(caught.value) == f"all_reduce_perf.log:5: {message}"


def test_a_superscript_digit_is_not_a_size():
    # "²".isdigit() but not isdecimal(): such a row is not a result, and the log has none
    with pytest.raises(ConfigError, match="no nccl-tests results found"):
        parse_nccl_tests(HEAD + "² 1 float sum -1 42.0\n", "all_reduce_perf.log")


def test_na_in_a_column_not_read_is_fine():
    # nccl-tests prints N/A for #wrong when it does not check the data (-c 0)
    measured = parse_nccl_tests(HEAD + ROW.replace("      0 ", "    N/A ") + "\n",
                                "all_reduce_perf.log")
    assert measured.samples == ((1048576, pytest.approx(42e-6)),)


def test_calibrate_prints_a_bad_log_as_one_line(tmp_path):
    log = tmp_path / "all_reduce_perf.log"
    log.write_text(HEAD + ROW.replace("42.00", "N/A") + "\n")
    out = cli("calibrate", "--nccl-tests", str(log), "--out", str(tmp_path / "fit.toml"))
    assert (out.returncode, out.stdout) == (2, "")
    assert out.stderr == (f"prism-debug: error: {log}:5: the time of 1048576 bytes is 'N/A', not "
                          "a positive number of microseconds: rerun that size, or delete the "
                          "line\n")
    log.write_bytes(b"\xff" + (HEAD + ROW).encode())
    out = cli("calibrate", "--nccl-tests", str(log), "--out", str(tmp_path / "fit.toml"))
    assert (out.returncode, out.stderr) == (
        2, f"prism-debug: error: {log} is not text (invalid start byte at byte 0): give the "
           "output of an nccl-tests run\n")
    assert not (tmp_path / "fit.toml").exists()
