"""bench/policy_report.py: the figures a run's measurements give, re-derived from numbers."""

from __future__ import annotations

from bench import policy_arms as arms
from bench import policy_report as report


def test_miss_cost_is_the_fitted_slope() -> None:
    def arm(misses_per_token: float, refused: int = 0) -> dict:
        # 5 ms a token plus 40 us a miss, over 1,000 tokens.
        return {"expert_misses": int(misses_per_token * 1000), "decode_tokens": 1000,
                "decode_s": 1000 * (5e-3 + misses_per_token * 40e-6), "refused": refused,
                "truncated": 0}

    cost = report.miss_cost({"a": arm(10), "b": arm(100), "c": arm(150),
                             "short": arm(1, refused=3)})
    assert cost == {"us_per_miss": 40.0, "ms_per_token_without_misses": 5.0, "arms": 3}
    assert report.miss_cost({"a": arm(10), "b": arm(10)}) is None


def test_miss_model_prices_each_miss_at_one_copy_and_shows_the_residual() -> None:
    def arm(misses: int, extra_s: float = 0.0, refused: int = 0) -> dict:
        # 10 ms a token plus 50 us a miss, over 1,000 tokens; `extra_s` is noise.
        return {"expert_misses": misses, "decode_tokens": 1000, "refused": refused,
                "truncated": 0, "decode_s": 1000 * 10e-3 + misses * 50e-6 + extra_s}

    model = report.miss_model({"static-full": arm(100_000), "grow-only": arm(20_000),
                               "headroom": arm(10_000), "static-short": arm(0, refused=5)},
                              expert_copy_us=50.0)
    assert model["ms_per_token_without_misses"] == 10.0
    assert model["arms"] == {"static-full": 66.67, "grow-only": 90.91, "headroom": 95.24}
    assert model["residual"] == {"static-full": 0.0, "grow-only": 0.0, "headroom": 0.0}
    assert model["ratios"]["headroom"]["vs_grow_only"] == 1.048
    assert model["no_miss_vs_grow_only"] == 1.1  # 11 s with its misses, 10 s without

    # Noise in one arm moves its measured figure, not what its misses predict.
    noisy = report.miss_model({"grow-only": arm(20_000, extra_s=-1.5),
                               "headroom": arm(10_000, extra_s=1.5)}, expert_copy_us=50.0)
    assert noisy["arms"] == {"grow-only": 90.91, "headroom": 95.24}
    assert noisy["residual"] == {"grow-only": -0.136, "headroom": 0.143}
    assert report.miss_model({"grow-only": arm(1)}, expert_copy_us=None) is None


def test_common_compares_the_requests_every_arm_served() -> None:
    def rows(*served: tuple[int, int, float]) -> list[dict]:
        return [{"index": i, "refused": tokens == 0, "completion_tokens": tokens,
                 "decode_s": seconds} for i, tokens, seconds in served]

    common = report.common_requests({
        "static-full": rows((0, 11, 1.0), (1, 21, 2.0), (2, 11, 1.0)),
        "headroom": rows((0, 11, 0.5), (1, 21, 1.0), (2, 0, 0.0)),  # cut before request 2
        "static-short": rows((0, 11, 0.1), (1, 0, 0.0), (2, 0, 0.0)),  # left out
    })
    assert common["requests"] == 2
    assert common["arms"] == {"static-full": 10.0, "headroom": 20.0}
    assert common["ratios"]["headroom"]["vs_static_full"] == 2.0


def test_a_window_of_one_network_read_has_no_per_request_rate() -> None:
    row = arms.RequestRow(0, "chat-0", "chat", 20, 2, status=200, completion_tokens=2,
                           decode_s=arms.MEASURED_WINDOW_S / 100)
    assert row.decode_tps is None
    run = {"per_request": {"a": [
        {**row.to_json(), "decode_tps": 115593.6},  # as a file from before the rule has it
        {**arms.RequestRow(1, "chat-1", "chat", 20, 11, status=200, completion_tokens=11,
                            decode_s=0.5).to_json()}]},
        "arms": {"a": {"per_request_tps_median": 57796.8, "per_request_tps_mean": 57796.8}}}
    report.rerate_requests(run)
    assert [r["decode_tps"] for r in run["per_request"]["a"]] == [None, 20.0]
    assert run["arms"]["a"] == {"per_request_tps_median": 20.0, "per_request_tps_mean": 20.0}
