"""The README's code must keep working as written (the demo: tests/test_demo.py)."""

import asyncio
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_readme_quickstart_runs(capsys):
    readme = (ROOT / "README.md").read_text()
    code = re.search(r"## Quickstart\n\n```python\n(.*?)```", readme, re.S).group(1)
    exec(compile(code, "README.md", "exec"), {"__name__": "__main__"})
    assert "{'counts': [{'key': 'total', 'n': 2}]}" in capsys.readouterr().out


def test_readme_delegation_example_runs(capsys):
    readme = (ROOT / "README.md").read_text()
    code = re.search(r"### Delegating to children\n.*?```python\n(.*?)```", readme, re.S).group(1)
    exec(compile(code, "README.md", "exec"), {"__name__": "__main__"})
    assert "INTRO / BODY / OUTRO" in capsys.readouterr().out


def test_readme_agent_example_defines_a_working_tool():
    readme = (ROOT / "README.md").read_text()
    code = re.search(r"### Agents\n.*?```python\n(.*?)```", readme, re.S).group(1)
    namespace: dict = {"__name__": "readme"}
    exec(compile(code, "README.md", "exec"), namespace)
    assert "helper" in namespace["registry"]
    result = asyncio.run(
        namespace["weather"]("t1", namespace["Weather"]("Oslo"), None, lambda u: None)
    )
    assert (result.content, result.details) == ("Sunny in Oslo", {"temp_c": 21})


def test_readme_context_management_example_runs():
    readme = (ROOT / "README.md").read_text()
    code = re.search(r"### Context management\n.*?```python\n(.*?)```", readme, re.S).group(1)
    namespace: dict = {"__name__": "readme"}
    exec(compile(code, "README.md", "exec"), namespace)
    asyncio.run(namespace["main"]())


def test_readme_stop_status_example_runs(capsys):
    readme = (ROOT / "README.md").read_text()
    code = re.search(r"### How runs end: .*?```python\n(.*?)```", readme, re.S).group(1)
    exec(compile(code, "README.md", "exec"), {"__name__": "__main__"})
    assert capsys.readouterr().out == "truncated max_tokens 'The first half'\n"


def test_readme_typed_contract_example_defines_an_agent(monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test")  # the example names a claude model
    readme = (ROOT / "README.md").read_text()
    code = re.search(r"### Typed tool contracts\n.*?```python\n(.*?)```", readme, re.S).group(1)
    namespace: dict = {"__name__": "readme"}
    exec(compile(code, "README.md", "exec"), namespace)
    manifest = namespace["analyst"].manifest()
    assert manifest["runtime_context"] == "Tenant"
    assert [(t["key"], t["id"], t["enabled"]) for t in manifest["tools"]] == [
        ("sql", "acme.sql/v1", "resolver")
    ]


def test_readme_schedules_example_runs(capsys):
    readme = (ROOT / "README.md").read_text()
    code = re.search(r"### Recurring schedules\n.*?```python\n(.*?)```", readme, re.S).group(1)
    exec(compile(code, "README.md", "exec"), {"__name__": "__main__"})
    out = capsys.readouterr().out
    assert "daily 0 9 * * 1-5 2030-06-03 09:00:00+02:00" in out
    assert "woken by daily@1906700400000 to write the report" in out


def _section_main(title: str) -> dict:
    readme = (ROOT / "README.md").read_text()
    code = re.search(rf"### {title}\n.*?```python\n(.*?)```", readme, re.S).group(1)
    namespace: dict = {"__name__": "readme"}
    exec(compile(code, "README.md", "exec"), namespace)
    asyncio.run(namespace["main"]())
    return namespace


def test_readme_request_options_example_runs():
    _section_main("Request options")


def test_readme_content_blocks_example_runs(capsys):
    _section_main("Images and documents in messages")
    assert "content[0]: media type 'image/svg+xml' is not one the API takes" in (
        capsys.readouterr().out
    )


def test_readme_structured_output_example_runs():
    namespace = _section_main("Structured output")
    assert namespace["results"][-1].output_type == "Verdict"


def test_readme_scripted_model_example_runs():
    namespace = _section_main("Testing with ScriptedModel")
    assert len(namespace["model"].requests) == 2
