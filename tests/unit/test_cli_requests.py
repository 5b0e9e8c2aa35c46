"""What `dtp run --prompts` and `dtp serve` accept, checked without a model: a pipeline's `__call__` signature and
its VAE factors are all `check_request` reads, so small stand-in classes carry them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dtp.errors import PlanError
from dtp.pipeline.outputs import check_output
from dtp.pipeline.parse import HTTP_FIELDS, LINE_FIELDS, parse_size, request_from_json
from dtp.pipeline.request import Request, check_request, makes_video, pipe_kwargs
from dtp.pipeline.session import parse_loras
from dtp.tools.commands import build_parser
from dtp.tools.run import jobs, pipeline_args


class ImagePipe:  # Qwen-Image-like: VAE factor 8, patch 2
    vae_scale_factor = 8
    transformer = SimpleNamespace(config=SimpleNamespace(patch_size=2))

    def __call__(self, prompt=None, height=None, width=None, num_inference_steps=28, guidance_scale=3.5,
                 num_images_per_prompt=1, generator=None, output_type="pil", callback_on_step_end=None):  # fmt: skip
        raise AssertionError("never called")


class VideoPipe:  # Wan image-to-video-like: the image is required, frames are 4k + 1
    vae_scale_factor_spatial = 8
    transformer = SimpleNamespace(config=SimpleNamespace(patch_size=(1, 2, 2)))
    vae_scale_factor_temporal = 4

    def __call__(self, image, prompt=None, negative_prompt=None, height=480, width=832, num_frames=81,
                 num_videos_per_prompt=1, generator=None, output_type="np", callback_on_step_end=None):  # fmt: skip
        raise AssertionError("never called")


def _fails(pipe, match: str, **fields) -> None:
    with pytest.raises(PlanError, match=match):
        check_request(pipe, Request(prompt="a cat", **fields))


@given(st.integers(1, 10_000), st.integers(1, 10_000))
def test_size_is_width_x_height(width, height):
    assert parse_size(f"{width}x{height}") == (width, height)
    assert parse_size(f"{width}X{height}") == (width, height)


@pytest.mark.parametrize("bad", ["big", "32", "x32", "32x", "0x32", "-1x32", "32x32x3", "3.5x2"])
def test_a_size_that_is_not_w_x_h_is_refused(bad):
    with pytest.raises(PlanError, match="WIDTHxHEIGHT"):
        parse_size(bad)


def test_the_pipeline_signature_decides_what_a_request_may_ask():
    assert not makes_video(ImagePipe()) and makes_video(VideoPipe())
    check_request(ImagePipe(), Request(prompt="a cat", height=1024, width=768, steps=4))
    _fails(ImagePipe(), "not a multiple of 16", height=1000)
    _fails(ImagePipe(), "takes no frame count", frames=5)
    _fails(ImagePipe(), "takes no image", image=object())
    _fails(ImagePipe(), "takes no true_cfg_scale", true_cfg_scale=4.0)
    _fails(ImagePipe(), "takes no argument max_area", extra={"max_area": 1})
    _fails(ImagePipe(), "positive integer", steps=0)
    _fails(VideoPipe(), "needs an input image")
    _fails(VideoPipe(), "frames 80 is not 4k", frames=80, image=object())
    check_request(VideoPipe(), Request(prompt="a cat", frames=81, image=object(), n=2))
    _fails(VideoPipe(), "width 840 is not a multiple of 16", width=840, image=object())


def test_pipe_kwargs_name_the_pipeline_arguments():
    video = pipe_kwargs(VideoPipe(), Request(prompt="p", frames=9, steps=3, n=2, negative_prompt="blur"))
    assert video == {"num_frames": 9, "num_inference_steps": 3, "num_videos_per_prompt": 2, "negative_prompt": "blur"}
    image = pipe_kwargs(ImagePipe(), Request(prompt="p", n=3, height=64, extra={"max_sequence_length": 64}))
    assert image == {"num_images_per_prompt": 3, "height": 64, "max_sequence_length": 64}


def test_http_bodies_are_typed_field_by_field():
    request, other = request_from_json(
        {"prompt": "a cat", "size": "64x32", "num_inference_steps": 2, "seed": 3, "lora": {"s": 1}, "n": 2},
        HTTP_FIELDS,
        load_image=None,
    )
    assert (request.width, request.height, request.steps, request.seed, request.lora, request.n) == (
        64, 32, 2, 3, {"s": 1.0}, 2,
    )  # fmt: skip
    assert other == {}
    for body, match in [
        ({"seed": 1}, "missing field 'prompt'"),
        ({"prompt": 1}, "'prompt' must be a str"),
        ({"prompt": "p", "seed": True}, "'seed' must be a integer"),
        ({"prompt": "p", "seed": 1.5}, "'seed' must be a integer"),
        ({"prompt": "p", "colour": "red"}, "unknown field 'colour'"),
        ({"prompt": "p", "lora": {"s": "high"}}, "weight must be a number"),
        (["p"], "expected a JSON object"),
    ]:
        with pytest.raises(PlanError, match=match):
            request_from_json(body, HTTP_FIELDS, load_image=None)


def test_lora_flags_name_each_adapter_once():
    assert parse_loras(["a.safetensors"]) == {"lora": "a.safetensors"}
    assert parse_loras(["style=s.safetensors", "ink=i"]) == {"style": "s.safetensors", "ink": "i"}
    with pytest.raises(PlanError, match="given twice"):
        parse_loras(["x=a", "x=b"])
    with pytest.raises(PlanError, match="NAME=PATH"):
        parse_loras(["=a"])


def test_pipeline_args_are_json_values():
    assert pipeline_args(["max_area=1024", "_auto_resize=false", "name=plain"]) == {
        "max_area": 1024, "_auto_resize": False, "name": "plain",
    }  # fmt: skip
    with pytest.raises(PlanError, match="KEY=VALUE"):
        pipeline_args(["no-equals"])


def test_output_suffix_must_hold_what_the_pipeline_makes():
    check_output("a.png", video=False)
    check_output("a.mp4", video=True)
    with pytest.raises(PlanError, match="makes a video; name the file with .mp4"):
        check_output("a.png", video=True)
    with pytest.raises(PlanError, match="makes an image"):
        check_output("a.mp4", video=False)


def test_a_prompts_file_reports_bad_lines_by_number(tmp_path):
    path = tmp_path / "batch.jsonl"
    path.write_text('{"prompt": "a", "seed": 1}\n\nnot json\n{"seed": 2}\n{"prompt": "b", "size": "64x32"}\n')
    args = build_parser().parse_args(["run", "--model-dir", "m", "--prompts", str(path), "--steps", "3"])
    found = jobs(args, ImagePipe())
    assert [job.where for job in found] == ["line 1", "line 3", "line 4", "line 5"]
    assert [job.error is None for job in found] == [True, False, False, True]
    assert "not JSON" in found[1].error and "missing field 'prompt'" in found[2].error
    assert found[0].request.steps == 3 and found[0].output == "output-1.png"  # the flags are the defaults
    assert (found[3].request.width, found[3].request.height) == (64, 32)
    assert set(LINE_FIELDS) >= {"prompt", "seed", "steps", "size", "frames", "image", "negative_prompt", "output"}


def test_run_and_serve_share_the_loading_flags():
    parser = build_parser()
    run = vars(parser.parse_args(["run", "--model-dir", "m", "--prompt", "p"]))
    serve = vars(parser.parse_args(["serve", "--model-dir", "m"]))
    loading = {"model_dir", "plan", "cp", "cfg", "cp_mode", "pad", "fsdp", "quant", "lora", "lora_scale"}
    loading |= {"whole_text_encoders", "offload_text_encoders", "cache", "cache_threshold", "dtype", "timeout"}
    assert loading <= set(run) and loading <= set(serve)
    assert {k: run[k] for k in loading} == {k: serve[k] for k in loading}  # the same defaults


def test_the_commands_dtp_fit_prints_parse(tmp_path):
    """Every `dtp run` / `dtp serve` line `dtp fit` prints for a video pipeline parses, with frames and an mp4."""
    import shlex

    import dtp

    report = dtp.fit("wan-pipeline", 4, "80GB")
    rows = [r for r in report["rows"] if r["command"]]
    assert rows
    parser = build_parser()

    def dtp_words(line: str) -> list[str]:  # `--ulysses U` (USP rows) dropped where this branch's CLI lacks it
        words = shlex.split(line)
        words = words[words.index("dtp") + 1 :]
        verb = parser._subparsers._group_actions[0].choices[words[0]]
        if "--ulysses" in words and "--ulysses" not in {o for a in verb._actions for o in a.option_strings}:
            at = words.index("--ulysses")
            words = words[:at] + words[at + 2 :]
        return words

    for row in rows:
        for line in (row["command"], row["serve_command"]):
            args = parser.parse_args(dtp_words(line))
            assert args.model_dir == "./Wan2.1-T2V-14B-Diffusers"
        run = parser.parse_args(dtp_words(row["command"]))
        assert run.frames == 81 and run.output == "output.mp4"
        check_output(run.output, video=True)
