"""Chat templates render as transformers renders them, inside a sandbox, with clear errors."""
from __future__ import annotations

import pytest
from transformers.utils.chat_template_utils import render_jinja_template

from runtime.text import ChatTemplate, ChatTemplateError

# Exercises what real templates use: loop controls, namespace, tojson with non-ASCII,
# raise_exception, trim/lstrip of block tags, tools, and the add_generation_prompt switch.
RICH = """{%- set ns = namespace(system='') -%}
{% for m in messages %}
  {% if m.role == 'system' %}{% set ns.system = m.content %}{% continue %}{% endif %}
  {% if m.role not in ['user', 'assistant', 'tool'] %}{{ raise_exception('bad role ' + m.role) }}{% endif %}
<|{{ m.role }}|>{{ bos_token if loop.first else '' }}{{ m.content | trim }}
  {% if m.tool_calls is defined %}{{ m.tool_calls | tojson }}{% endif %}
  {% if loop.index > 5 %}{% break %}{% endif %}
{% endfor %}
{% if tools %}TOOLS {{ tools | tojson(indent=2) }}{% endif %}
SYSTEM={{ ns.system }}
{% if add_generation_prompt %}<|assistant|>{% endif %}"""

CONVERSATIONS = [
    [{"role": "user", "content": "Hello"}],
    [{"role": "system", "content": "Be brief. Ünïcödé ok"}, {"role": "user", "content": "  Weather in 東京? 😀  "},
     {"role": "assistant", "content": "Let me check.", "tool_calls": [{"name": "weather", "args": {"city": "東京"}}]},
     {"role": "tool", "content": "sunny"}],
    [{"role": "user", "content": str(i)} for i in range(9)],
]
TOOLS = [{"type": "function", "function": {"name": "weather", "description": "Météo", "parameters": {}}}]


@pytest.mark.parametrize("conversation", CONVERSATIONS, ids=["one", "tools", "break"])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_render_matches_transformers(conversation: list[dict], add_generation_prompt: bool) -> None:
    ours = ChatTemplate(RICH).render(conversation, add_generation_prompt=add_generation_prompt,
                                     tools=TOOLS, bos_token="<s>")
    (theirs,), _ = render_jinja_template([conversation], tools=TOOLS, chat_template=RICH,
                                         add_generation_prompt=add_generation_prompt, bos_token="<s>")
    assert ours == theirs
    assert ("<|assistant|>" in ours.splitlines()[-1]) == add_generation_prompt


def test_none_valued_keys_are_dropped() -> None:
    template = ChatTemplate("{% for m in messages %}{{ m.role }}:{{ m.tool_calls is defined }}{% endfor %}")
    assert template.render([{"role": "assistant", "content": "x", "tool_calls": None}]) == "assistant:False"


def test_raise_exception_becomes_chat_template_error() -> None:
    with pytest.raises(ChatTemplateError, match="bad role narrator"):
        ChatTemplate(RICH).render([{"role": "narrator", "content": "once upon"}])


@pytest.mark.parametrize("source", [
    "{{ messages.__class__.__mro__ }}",                  # attribute escape
    "{% set _ = messages.append({'role': 'x'}) %}",      # mutation of the caller's data
    "{{ messages[0].content + 1 }}",                     # a Python TypeError inside the template
])
def test_unsafe_or_broken_templates_raise_chat_template_error(source: str) -> None:
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(ChatTemplateError):
        ChatTemplate(source).render(messages)
    assert messages == [{"role": "user", "content": "hi"}]


def test_syntax_error_is_reported_at_compile_time() -> None:
    with pytest.raises(ChatTemplateError, match="does not compile"):
        ChatTemplate("{% for m in messages %}{{ m }}")


def test_messages_must_be_objects() -> None:
    with pytest.raises(ChatTemplateError, match="role"):
        ChatTemplate("{{ messages }}").render(["just a string"])  # type: ignore[list-item]
