"""Prompts the verifier writes itself (self-instruct style), across the task types of Spec-Bench.

Each request asks the verifier for a piece of text (an article, a passage, a word problem, a programming task,
sentences in another language, ...) about a topic, for an audience; :func:`build_prompt` wraps what it wrote
into a training prompt of the task's group (summarising it, answering a question over it, translating it,
solving it, extracting from it, ...). Topics, audiences and templates are general knowledge written here,
nothing from an evaluation set; :func:`dedupe` drops prompts that come out the same.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

#: topics across everyday life, science, work, culture and places (general knowledge)
TOPICS = (
    "a new public library", "electric buses", "a local football match", "coral reefs", "a bakery opening",
    "solar panels on schools", "a museum exhibition", "urban gardening", "a mountain rescue", "the history of tea",
    "recycling plastic", "a science fair", "remote work", "volcanoes", "honey bees", "a city marathon",
    "the printing press", "water conservation", "a music festival", "online privacy", "rainforests", "chess",
    "a new bridge", "healthy breakfast habits", "the moon landing", "learning a second language", "wind farms",
    "a robotics competition", "ancient Egypt", "bicycles in cities", "a school play", "ocean plastic", "jazz",
    "vaccines", "a farmers market", "space telescopes", "a heat wave", "board games", "the water cycle",
    "a charity run", "smartphones and sleep", "the Great Wall of China", "a flood warning", "photography",
    "composting", "a new hospital wing", "penguins", "a power outage", "the Olympic Games", "video games",
    "train travel", "a job interview", "saving money", "a birthday party", "house plants", "the human heart",
    "earthquakes", "a small business", "public speaking", "the stock market", "climate change", "a road trip",
    "cooking pasta", "dinosaurs", "the internet", "a hiking trail", "renewable energy", "a new smartphone",
    "the Roman Empire", "a summer camp", "artificial intelligence", "first aid", "a city park", "the solar system",
    "coffee", "a wedding", "dog training", "a rainy weekend", "electric cars", "a school exam", "the ocean tides",
    "a book club", "time management", "a local election", "a bike repair shop", "the immune system", "glaciers",
    "a street food market", "cyber security", "a theater premiere", "birds migrating", "the French Revolution",
    "a yoga class", "3D printing", "a lost wallet", "a new restaurant", "mobile banking", "the Amazon river",
    "a family reunion", "sleep and memory", "a snowstorm", "public transport fares", "a science museum",
    "the periodic table", "a tennis tournament", "a community garden", "self-driving cars", "the Renaissance",
    "a job fair", "drinking water", "a spelling bee", "open source software", "a zoo", "the stock of a shop",
    "a moving day", "a volunteer program", "desert animals", "a film festival", "bread baking", "the northern lights",
    "a pharmacy", "a playground", "email etiquette", "a startup", "the human brain", "a lighthouse", "recycled paper",
    "a talent show", "wildfires", "a language exchange", "the metric system", "a supermarket", "a fishing village",
    "an online course", "a news podcast", "the bicycle", "a chemistry lab", "a train delay", "a budget for a trip",
    "a football transfer", "a coding bootcamp", "a castle", "a recipe for soup", "the Silk Road", "an art class",
)
#: who the text is for (varies length, tone and vocabulary)
AUDIENCES = ("children", "students", "a general audience", "experts", "tourists", "a local newspaper",
             "beginners", "busy professionals", "retired people", "a company newsletter")
LANGUAGES = ("French", "German", "Spanish", "Italian", "Portuguese", "Dutch")
QUESTIONS = ("What are the main facts the passage gives about {topic}?", "What problem does the passage describe?",
             "Who is involved, according to the passage?", "What happens at the end of the passage?",
             "Why does the passage say this matters?", "What numbers or dates does the passage mention?")
FOLLOW_UPS = ("Explain your answer step by step.", "Keep the answer short.", "Answer in one sentence.",
              "Use a list.", "")


@dataclass(frozen=True)
class Task:
    """One kind of self-written prompt: what the verifier is asked to write, and the prompt built around it."""

    group: str
    ask: str  # to the verifier; {topic} {audience} {language}
    prompt: str  # the training prompt; {text} is what the verifier wrote, plus {topic} {language} {question} {follow_up}


TASKS = (
    Task("summarization", "Write a short news article about {topic} for {audience}.",
         "Summarize the following article in a few sentences.\n\n{text}"),
    Task("summarization", "Write a short report about {topic} for {audience}.",
         "Give a one-sentence summary of this text.\n\n{text}"),
    Task("translation", "Write three simple sentences about {topic}.",
         "Translate the following text into {language}.\n\n{text}"),
    Task("translation", "Write two short sentences in {language} about {topic}.",
         "Translate the following {language} text into English.\n\n{text}"),
    Task("qa", "Write a paragraph of facts about {topic} for {audience}.",
         "Read the passage and answer the question.\n\nPassage: {text}\n\nQuestion: {question}"),
    Task("qa", "Write a short question someone might ask about {topic}. Reply with the question only.",
         "{text} {follow_up}"),
    Task("math", "Write a math word problem about {topic} that takes two or three steps to solve. "
                 "Reply with the problem only.", "{text}"),
    Task("math", "Write a short arithmetic question involving {topic}. Reply with the question only.",
         "Solve this step by step: {text}"),
    Task("code", "Write a one-sentence programming task related to {topic} for a Python beginner. "
                 "Reply with the task only.", "{text}"),
    Task("code", "Write a short Python function related to {topic}.",
         "Explain what the following code does.\n\n{text}"),
    Task("extraction", "Write a short paragraph about {topic} that mentions people, places and dates.",
         "Extract every person, place and date from the text below as a list.\n\n{text}"),
    Task("instructions", "Write one instruction that a user might give an AI assistant about {topic}. "
                         "Reply with the instruction only.", "{text}"),
    Task("chat", "Write a message asking a friend for advice about {topic}. Reply with the message only.", "{text}"),
    Task("writing", "Write a one-sentence request for a short story or poem about {topic}. "
                    "Reply with the request only.", "{text}"),
)

SOURCE = "written by the verifier (self-instruct style)"
LICENSE = "the verifier's output; follow the verifier's license"


def self_instruct_requests(count: int, seed: int = 0) -> list[dict[str, str]]:
    """``count`` requests (``{"id", "ask", "template", "group", "topic", "language", "question", "follow_up"}``),
    tasks in turn, topics / audiences / languages / questions drawn with ``seed``."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        task = TASKS[i % len(TASKS)]
        topic, audience, language = rng.choice(TOPICS), rng.choice(AUDIENCES), rng.choice(LANGUAGES)
        out.append({"id": f"si-{i}", "ask": task.ask.format(topic=topic, audience=audience, language=language),
                    "template": task.prompt, "group": task.group, "topic": topic, "language": language,
                    "question": rng.choice(QUESTIONS).format(topic=topic), "follow_up": rng.choice(FOLLOW_UPS)})
    return out


def build_prompt(request: dict[str, str], text: str) -> str | None:
    """The training prompt around the verifier's answer ``text`` to ``request``; ``None`` for an answer too short
    (or too long: a runaway answer) to make one."""
    text = text.strip()
    if not 8 <= len(text) <= 4000:
        return None
    fields = {k: request.get(k, "") for k in ("topic", "language", "question", "follow_up")}
    return request["template"].format(text=text, **fields).strip()


def normalise(prompt: str) -> str:
    """The form two prompts are compared in to find duplicates (case, spaces and punctuation ignored)."""
    return re.sub(r"[\W_]+", " ", prompt.lower()).strip()


def dedupe(prompts: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """``(id, prompt)`` pairs without the ones whose prompt normalises like an earlier one's."""
    seen: set[str] = set()
    out = []
    for pid, prompt in prompts:
        key = normalise(prompt)
        if key not in seen:
            seen.add(key)
            out.append((pid, prompt))
    return out
