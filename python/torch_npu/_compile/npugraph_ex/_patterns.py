"""``register_replacement``: a pattern and its replacement, applied to every graph the
torchair and npugraph_ex backends compile (torch._inductor's pattern matcher).

The replacements of all callers share one pass: in the aclgraph modes it runs in
``_optimize_fx`` when ``pattern_fusion_pass`` is on, in max-autotune as inductor's
post-grad pre-pass. ``extra_check(match)`` decides per match, as on the adapter.
"""
import functools

__all__ = ["register_replacement"]


def _return_true(match):
    return True


@functools.cache
def _pass():
    from torch._inductor.pattern_matcher import PatternMatcherPass
    return PatternMatcherPass(pass_name="npugraph_ex_pattern_pass")


def register_replacement(search_fn, replace_fn, example_inputs, trace_fn=None, extra_check=_return_true,
                         search_fn_pattern=None, scalar_workaround=None, skip_duplicates=False):
    """Registers ``replace_fn`` in place of the graphs ``search_fn`` traces to (on
    ``example_inputs``; ``trace_fn`` is torch._inductor.pattern_matcher.fwd_only by default)."""
    from torch._inductor import pattern_matcher as pm
    return pm.register_replacement(search_fn=search_fn, replace_fn=replace_fn, example_inputs=example_inputs,
                                   trace_fn=trace_fn if trace_fn is not None else pm.fwd_only, pass_dicts=_pass(),
                                   extra_check=extra_check, search_fn_pattern=search_fn_pattern,
                                   scalar_workaround=scalar_workaround, skip_duplicates=skip_duplicates)


def apply(graph):
    """Applies every registered replacement to ``graph``; returns how many matched."""
    if not _pass().patterns:
        return 0
    return _pass().apply(graph)
