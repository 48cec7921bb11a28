"""Region tables baked into graphs (``regions:512=<cfg>;*=torch``): one spelling, checked bounds, round trip."""
import pytest

from oasr_ops.runtime.plans import check_config_arg, format_table, parse_table, resolve_table

A, B = "t64x32x64_c1x1_pp", "t64x128x64_c1x1_pp"


@pytest.mark.parametrize("table", [
    f"regions:16={A};512={B};*=torch", f"regions:64={A}", "regions:*=torch", f"regions:1={A};2={B};3=default",
    f"regions:{2**62}={A};*=fused",
])
def test_round_trip(table):
    assert format_table(list(parse_table(table))) == table


@pytest.mark.parametrize("table,why", [
    ("regions:-5=torch", "positive integer"), ("regions:0=torch", "positive integer"),
    ("regions:05=torch", "positive integer"), ("regions:+5=torch", "positive integer"),
    ("regions:1_0=torch", "positive integer"), ("regions: 5=torch", "positive integer"),
    ("regions:\u0665=torch", "positive integer"), ("regions:5.0=torch", "positive integer"),
    ("regions:512=torch;512=fused", "does not increase"), ("regions:512=torch;64=fused", "does not increase"),
    ("regions:*=torch;64=fused", "must be last"), ("regions:*=torch;*=fused", "must be last"),
    ("regions:", "no regions"), ("regions:5=torch;", "is not <m_hi>=<config>"), ("regions:5", "is not"),
    ("regions:5=", "is not"), ("regions:5=auto", "unknown config"), ("regions:5=torch\n", "unknown config"),
    (f"regions:5={A}_a8", "unknown config"), ("regions:5=../../x", "unknown config"),
])
def test_bad_tables_name_the_table(table, why):
    with pytest.raises(ValueError, match=why) as e:
        parse_table(table)
    assert repr(table)[:40] in str(e.value)
    with pytest.raises(ValueError, match="oasr.gemm"):
        check_config_arg(table, "gemm")


def test_format_refuses_what_parse_rejects():
    with pytest.raises(ValueError):
        format_table([(512, A), (64, B)])
    with pytest.raises(ValueError):
        format_table([(None, A), (64, B)])
    with pytest.raises(ValueError):
        format_table([(0, A)])


def test_resolve_round_up_and_open_end():
    t = format_table([(16, A), (512, B)])
    assert [resolve_table(t, m) for m in (1, 16, 17, 512, 513)] == [A, A, B, B, "auto"]
