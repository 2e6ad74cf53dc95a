"""The projection's arithmetic (specq.bench.projection): pass costs between and beyond the row
counts measured, a chain's tokens and cost per step, the best cap, routes mixed by their share of
the text, and a measured run re-priced. Every expected number is worked out by hand."""

import pytest

from specq.bench.projection import (Chain, PassCosts, best_gamma, chain_cost, chain_speed, mix,
                                    replay, route_speed)

FLAT = PassCosts({1: 1.0, 16: 1.0})  # a pass of up to 16 rows costs one step
PER_ROW = PassCosts({1: 1.0, 2: 2.0, 4: 4.0})  # each row costs a step


def test_pass_costs_are_linear_between_counts_and_along_the_last_segment_beyond():
    costs = PassCosts({1: 1.0, 2: 1.5, 4: 2.0})
    assert costs(1) == 1.0 and costs(2) == 1.5 and costs(4) == 2.0
    assert costs(3) == pytest.approx(1.75)
    assert costs(6) == pytest.approx(2.5)  # 0.25 a row past 4, as from 2 to 4
    assert costs(1.5) == pytest.approx(1.25)  # a mean row count


def test_a_pass_is_never_priced_below_one_of_fewer_rows():
    costs = PassCosts({1: 1.0, 2: 0.9, 4: 1.2})  # 2 rows timed below 1: noise
    assert costs.table == {1: 1.0, 2: 1.0, 4: 1.2}
    assert costs(3) == pytest.approx(1.1)


@pytest.mark.parametrize("measured", [{2: 1.5, 4: 2.0}, {1: 1.0}, {1: 2.0, 2: 3.0},
                                      {1: 1.0, 2: -1.0}])
def test_pass_costs_need_a_one_row_step_and_another_positive_count(measured):
    with pytest.raises(ValueError):
        PassCosts(measured)


def test_every_token_accepted_at_a_flat_pass_cost():
    chain = Chain.from_rates([1.0] * 4)
    assert [chain.tokens(g) for g in range(5)] == [1, 2, 3, 4, 5]
    # free drafting: every token drafted is one more per step
    assert [chain_speed(chain, g, FLAT, 0.0) for g in range(5)] == [1, 2, 3, 4, 5]
    # a tenth of a step per drafted token: (1 + g) / (1 + g / 10)
    assert chain_speed(chain, 4, FLAT, 0.1) == pytest.approx(5 / 1.4)
    # each row costing a step, whatever is accepted buys nothing
    assert [chain_speed(chain, g, PER_ROW, 0.0) for g in range(4)] == pytest.approx([1.0] * 4)


def test_the_best_gamma_weighs_acceptance_against_the_draft_and_pass_costs():
    chain = Chain.from_rates([0.9, 0.5, 0.2])  # at least 1, 2, 3 accepted: 0.9, 0.45, 0.09
    # a fifth of a step per token: gamma 0..3 give 1, 1.9/1.2, 2.35/1.4, 2.44/1.6
    speeds = [chain_speed(chain, g, FLAT, 0.2) for g in range(4)]
    assert speeds == pytest.approx([1.0, 1.9 / 1.2, 2.35 / 1.4, 2.44 / 1.6])
    assert best_gamma(chain, FLAT, 0.2) == 2
    assert best_gamma(chain, FLAT, 0.0) == 3  # free drafting: the longest
    assert best_gamma(chain, FLAT, 2.0) == 0  # a draft dearer than a step: plain decoding
    # passes a step a row: gamma 1 gives 1.9 / 2.0, below plain
    assert best_gamma(chain, PER_ROW, 0.0) == 0


def test_a_draft_that_stops_early_pays_for_the_rows_it_drafted():
    # 10 steps: all drafted position 1 and 6 position 2; 8 and 4 accepted
    chain = Chain.from_counts([10, 6], [8, 4], 10)
    assert chain.drafted == (1.0, 0.6) and chain.accepted == (0.8, 0.4)
    assert chain.rows(2) == pytest.approx({2: 0.4, 3: 0.6})
    assert chain.rows(1) == {2: 1.0}
    assert chain.tokens(2) == pytest.approx(2.2)
    assert chain.drafted_tokens(2) == pytest.approx(1.6)
    # passes 0.4 * 2 + 0.6 * 3 rows, 1.6 tokens at half a step, 0.1 of overhead
    assert chain_cost(chain, 2, PER_ROW, 0.5, 0.1) == pytest.approx(0.8 + 1.8 + 0.8 + 0.1)


def test_a_step_whose_draft_stopped_before_the_first_token_is_a_one_row_pass():
    chain = Chain.from_counts([8], [6], 10)
    assert chain.rows(1) == pytest.approx({1: 0.2, 2: 0.8})
    assert chain_cost(chain, 1, PER_ROW, 0.0) == pytest.approx(0.2 + 1.6)


@pytest.mark.parametrize("drafted, accepted", [((0.5,), (0.6,)), ((0.5, 0.6), (0.4, 0.3)),
                                               ((1.0, 1.0), (0.4, 0.5)), ((1.0,), (0.5, 0.4))])
def test_a_chain_refuses_shares_that_cannot_be(drafted, accepted):
    with pytest.raises(ValueError):
        Chain(drafted, accepted)


def test_a_chain_is_priced_only_at_the_positions_measured():
    chain = Chain.from_rates([0.9, 0.8])
    with pytest.raises(ValueError, match="outside the measured positions"):
        chain.tokens(3)


def test_routes_cover_their_share_of_the_text_at_their_own_speed():
    # half the text at 1 token a step, half at 3: 1 / (0.5 / 1 + 0.5 / 3)
    assert mix({"plain": 0.5, "lookup": 0.5}, {"plain": 1.0, "lookup": 3.0}) == pytest.approx(1.5)
    assert mix({"plain": 0.0, "lookup": 2.0}, {"plain": 1.0, "lookup": 3.0}) == pytest.approx(3.0)
    with pytest.raises(ValueError):
        mix({"plain": 0.0}, {"plain": 1.0})


def test_a_route_as_measured_is_priced_at_its_mean_rows():
    # 10 steps drafting 40 tokens, 20 accepted: 3 tokens a step, 5-row passes
    assert route_speed(10, 40, 20, PER_ROW) == pytest.approx(3 / 5)
    assert route_speed(10, 40, 20, FLAT, draft=0.01, overhead=0.1) == pytest.approx(3 / 1.14)
    assert route_speed(10, 0, 0, FLAT, overhead=0.25) == pytest.approx(0.8)  # plain steps


def test_a_measured_run_re_priced():
    # 10 one-row and 10 five-row passes for 60 tokens, 2 steps of drafting and overhead
    assert replay({1: 10, 5: 10}, 60, FLAT, 2.0) == pytest.approx(60 / 22)
    assert replay({1: 10, 5: 10}, 60, PassCosts({1: 1.0, 4: 2.5}), 0.0) == pytest.approx(60 / 40)
