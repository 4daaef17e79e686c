"""The offline `sglang.Engine` serves an image and a video on the tiny model, pruning the video at the rate
the engine was given (`json_model_override_args`, as for a server)."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from sglang_evs.testing.server import CPU_ENV

pytestmark = pytest.mark.slow  # the full suite only (see pyproject.toml)

ENGINE_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import sglang as sgl

    if __name__ == "__main__":
        model, image, video = sys.argv[1:4]
        engine = sgl.Engine(
            model_path=model, device="cpu", attention_backend="torch_native",
            max_total_tokens=16384, dtype="float32", log_level="error",
            json_model_override_args='{"video_pruning_rate": 0.75}',
        )
        prompt = (
            "<|im_start|>user\\n<|vision_start|>{}<|vision_end|>Describe this.<|im_end|>\\n"
            "<|im_start|>assistant\\n"
        )
        params = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
        image_out = engine.generate(prompt.format("<|image_pad|>"), params, image_data=image)
        video_out = engine.generate(prompt.format("<|video_pad|>"), params, video_data=video)
        engine.shutdown()
        print("RESULT " + json.dumps([image_out["meta_info"], video_out["meta_info"]]))
    """
)


def test_engine_image_and_video(tiny_model_dir, media_dir, tmp_path):
    script = tmp_path / "engine_run.py"
    script.write_text(ENGINE_SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script), str(tiny_model_dir), str(media_dir / "image.png"), str(media_dir / "moving.mp4")],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **CPU_ENV},
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result_line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
    image_meta, video_meta = json.loads(result_line.removeprefix("RESULT "))
    assert image_meta["completion_tokens"] == 8 and image_meta["image_tokens"] == 64
    assert video_meta["completion_tokens"] == 8
    # 2 temporal groups of 100 tokens: EVS keeps max(one group, 25 %) = 100
    assert (video_meta["video_tokens_before_pruning"], video_meta["video_tokens_after_pruning"]) == (200, 100)
    assert video_meta["video_pruning_method"] == "evs" and video_meta["video_pruning_rate"] == 0.75
    assert "run_scheduler_process" in done.stderr  # the plugin announced itself in the scheduler
