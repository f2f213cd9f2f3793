"""The option readers of the selectors module: rank lists and iteration lists."""

import pytest

from prism_debug.errors import ConfigError
from prism_debug.graph.selectors import number_list, rank_list


def test_a_rank_list_reads_ranges_nodes_and_nothing_from_blank_text():
    assert rank_list("0, 4096-4098,0", 8192, 8, "--ranks") == (0, 4096, 4097, 4098)
    assert rank_list("node 2", 64, 8, "--ranks") == tuple(range(16, 24))
    assert rank_list("", 64, 8, "--ranks") == rank_list("  ", 64, 8, "--ranks") == ()


@pytest.mark.parametrize(("text", "message"), [
    ("x", "cannot read 'x' as ranks: use R, A-B, a list of them separated by commas, or node N"),
    ("0,", "cannot read '' as ranks: use R, A-B, a list of them separated by commas, or node N"),
    ("0-999999999", "rank 999999999 is outside the world of 64 ranks"),
    ("5-3", "the range 5-3 runs backwards"),
])
def test_a_rank_list_says_which_option_is_wrong_and_how(text, message):
    with pytest.raises(ConfigError, match=f"^--trace-ranks: {message}$"):
        rank_list(text, 64, 8, "--trace-ranks")


def test_a_number_list_has_no_upper_bound_and_names_what_it_reads():
    assert number_list("3,10", "--snapshot-at", "iterations") == (3, 10)
    assert number_list("2-4, 3, 1000000", "--snapshot-at", "iterations") == (2, 3, 4, 1000000)
    assert number_list("", "--snapshot-at", "iterations") == ()
    with pytest.raises(ConfigError, match="^--snapshot-at: cannot read '3x' as iterations: use N, "
                                          "A-B, or a list of them separated by commas$"):
        number_list("1,3x", "--snapshot-at", "iterations")
    with pytest.raises(ConfigError, match="^--snapshot-at: the range 4-2 runs backwards$"):
        number_list("4-2", "--snapshot-at", "iterations")
