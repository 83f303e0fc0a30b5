"""Every flag ``inferwatch advise`` proposes for vLLM is one the installed vLLM's own argument
parser accepts, with the value proposed, for windows that fire each rule."""

from __future__ import annotations

import json
import subprocess

import pytest

from inferwatch.advise import plan as planning
from inferwatch.advise.proposals import proposals
from inferwatch.capacity import planner as cap
from support.advise import MODEL, window
from support.realengine import vllm_python

pytestmark = pytest.mark.realengine

#: parses each argument list with ``vllm serve``'s engine arguments; prints what it read, or
#: the parser's complaint for a list it refuses
PARSE = """
import contextlib, io, json, sys
from vllm.engine.arg_utils import EngineArgs
try:
    from vllm.utils.argparse_utils import FlexibleArgumentParser
except ImportError:
    from vllm.utils import FlexibleArgumentParser
out = []
for argv in json.load(sys.stdin):
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            out.append(vars(parser.parse_args(argv)))
    except SystemExit:
        out.append({"refused": err.getvalue().strip().splitlines()[-1]})
print(json.dumps(out, default=str))
"""

WINDOWS = {
    "batch-bound": window(),
    "memory-bound": window(preemptions=12, kv_usage_max=0.97),
    "prefill-bound": window(prefill_share=0.8, queue_mean=0.01, prompt_tokens=3000,
                            prompt_tokens_p99=6000),
    "many replicas": window(requests=60 * 400),
}  # fmt: skip


def parsed(argvs: list[list[str]]) -> list[dict[str, object]]:
    done = subprocess.run(
        [vllm_python(), "-c", PARSE], input=json.dumps(argvs), capture_output=True, text=True,
        timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    result: list[dict[str, object]] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_vllm_accepts_every_flag_advise_proposes() -> None:
    model, gpu = cap.model_preset(MODEL), cap.gpu_preset("H100")
    argvs, expected = [], []
    for seen in WINDOWS.values():
        chosen = planning.plan(seen, model, gpu, 1, planning.Objectives(2.5))
        flags = [(p.flag, p.setting, p.value) for p in proposals(seen, chosen) if p.flag]
        assert len(flags) == 4, flags
        argvs.append([part for flag, _, value in flags for part in (flag, f"{value:g}")])
        expected.append({setting: value for _, setting, value in flags})
    argvs.append(["--max-num-seqz", "8"])  # the parser refuses what it does not know
    *accepted, refused = parsed(argvs)
    assert "refused" in refused, refused
    for read, wanted, argv in zip(accepted, expected, argvs[:-1], strict=True):
        assert "refused" not in read, (argv, read)
        assert {setting: float(str(read[setting])) for setting in wanted} == wanted, argv
