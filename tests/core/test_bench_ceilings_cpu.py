"""CPU: the compute ceilings the benchmark suites report (`harness.ComputeCeiling`) and issue 41's prefill report of
the FP8 suite, on rows made up here (no GPU: the arithmetic and the tables, not the measurements)."""

import pytest

from cute_kernels.bench import harness as H


def test_the_spec_peaks_are_the_per_clock_rates_at_the_boost_clock():
    for dtype, spec in (("bf16", 989.4), ("fp8", 1978.9)):
        c = H.ComputeCeiling(dtype, tflops=0.8 * spec, clock_mhz=1830.0, sms=132)
        assert c.peak_at_clock == pytest.approx(spec, rel=1e-3)


def test_a_ceiling_without_a_clock_reports_no_peak():
    c = H.ComputeCeiling("fp8", tflops=1457.8, clock_mhz=None, sms=132)
    assert c.peak_at_clock is None
    assert c.meta() == {"fp8_gemm_8192_tflops": 1457.8, "sm_clock_mhz": None}
    assert "1458 TFLOP/s" in c.line() and "MHz" not in c.line()


def test_meta_and_line_name_the_clock_and_the_share_of_its_peak():
    c = H.ComputeCeiling("fp8", tflops=1457.8, clock_mhz=1500.0, sms=132)
    peak = 132 * 8192 * 1500e6 / 1e12
    assert c.meta() == {"fp8_gemm_8192_tflops": 1457.8, "sm_clock_mhz": 1500.0,
                        "fp8_peak_at_clock_tflops": round(peak, 1)}
    line = c.line()
    assert "_scaled_mm" in line and "1500 MHz" in line and f"{peak:.0f} TFLOP/s" in line
    assert f"{100 * 1457.8 / peak:.1f} %" in line


def test_unknown_ceiling_dtypes_are_refused_by_name():
    with pytest.raises(ValueError, match="dtype"):
        H.compute_ceiling("fp16")


def _row(shape, ours_ms, cublas_ms, flops=2 * 4096 * 7168 * 16384):
    refs = {} if cublas_ms is None else {"torch._scaled_mm": cublas_ms}
    return H.Row("fp8_gemm", "e4m3", shape, 0, flops, ours_ms, refs, "tflops", 1400.0)


def test_the_prefill_bar_is_each_m4096_shape_over_cublas():
    from cute_kernels.fp8_gemm.bench import PREFILL_BAR, _prefill_checks

    rows = [_row("4096x7168x16384", 1.0, 1.12), _row("4096x4096x7168", 1.0, 1.05), _row("64x4096x7168", 1.0, 2.0)]
    (check,) = _prefill_checks(rows)
    assert not check["ok"] and "min 1.050x (4096x4096x7168)" in check["measured"] and "64x" not in check["measured"]
    (check,) = _prefill_checks(rows[:1])
    assert check["ok"] and PREFILL_BAR == 1.1
    assert _prefill_checks([rows[2]]) == []


def test_the_clock_table_puts_ours_beside_cublas():
    from cute_kernels.fp8_gemm.bench import _at_clock_table

    c = H.ComputeCeiling("fp8", tflops=1400.0, clock_mhz=1500.0, sms=132)
    r = _row("4096x7168x16384", 1.0, 1.1)
    table = _at_clock_table([r, _row("4096x2112x7168", 1.0, None)], c)
    lines = table.splitlines()
    assert lines[0] == "## At the measured clock" and len(lines) == 6
    cells = [x.strip() for x in lines[4].strip("|").split("|")]
    at = c.peak_at_clock
    assert cells[0] == "4096x7168x16384"
    assert float(cells[2]) == pytest.approx(100 * r.ours_tbs / at, abs=0.05)
    assert float(cells[4]) == pytest.approx(100 * r.rate(1.1) / at, abs=0.05)
    assert float(cells[5]) == pytest.approx(100 * r.ours_tbs / 1400.0, abs=0.05)
    assert lines[5].count("n/a") == 3  # no cuBLAS time: its three cells
