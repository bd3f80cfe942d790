"""Requests that quote their input (summarize, answer from a passage, extract, translate), on material the target
writes itself.

A draft learns to copy from the prompt only from answers that copy from it: of the real target's training requests
before these, 1 in 60 carried a passage (module docstrings of the code corpus), and its EAGLE drafts passed a first
draft token on 7-28% of the steps of the chat set's translation and summarization prompts, against 40-68% elsewhere.
Passages cannot be had offline beyond the corpus's docstrings, so the target writes them: a short news report, a
few sentences naming people / prices / dates / places, one everyday sentence (`material_ask`, a subject drawn from
word lists); `request` then wraps what it wrote in the request a user would send (`QUOTING_KINDS`). The target
answers those requests like any other (`regenerate`). train/self_instruct.py runs it (`--kinds`), with the same
checks (new, no 8-word run shared with an evaluation prompt).
"""
from __future__ import annotations

import random
import re

from draftkit.train.chat_prompts import LANGUAGES as DOC_LANGUAGES

QUOTING_KINDS = ("summarization", "rag", "extraction", "translation")

EVENTS = ["a new bakery opening", "a school science fair", "a flood warning", "a change to the bus timetable",
          "a charity fun run", "a museum's new exhibition", "a football club hiring a coach", "a power cut",
          "a weekly farmers' market", "a hospital opening a new wing", "a road closed for repairs",
          "a library extending its hours", "a local election result", "a heatwave", "a lost dog found by hikers",
          "a factory adding night shifts", "a town festival", "a water price rise", "a new cycle path",
          "a theatre reopening after renovation", "a storm damaging roofs", "a robotics club winning a prize",
          "a company moving its offices", "a train strike", "a record harvest", "a zoo welcoming a baby giraffe"]
PLACES = ["Millbrook", "Eastport", "Harwick", "Lindenfeld", "Port Avery", "Stonebridge", "Caldera Bay", "Oakhurst",
          "New Tarrow", "Wrenfield", "Kessler Falls", "Ashby Cross"]
FACTS = {  # what the sentences must mention -> requests that extract it
    "three people with their ages": [
        "Return a JSON list of the people in this text with their ages: '{m}'",
        "Who is mentioned here, and how old is each of them? '{m}'"],
    "several shop items with their prices": [
        "List every item and its price from this text: '{m}'",
        "Make a table of the products and prices in: '{m}'"],
    "two or three dates": [
        "Write each date in this text in the format YYYY-MM-DD: '{m}'",
        "Which dates does this text mention? '{m}'"],
    "two cities and the weather in each": [
        "Pull out each city and its weather from this text as JSON: '{m}'",
        "For every place named here, give the weather: '{m}'"],
    "several company names": [
        "Which organisations does this text name? Answer as a JSON list: '{m}'",
        "Pick out the company names in: '{m}'"],
    "a recipe's ingredients with quantities": [
        "Turn this into an ingredient list with quantities: '{m}'",
        "Extract the ingredients and amounts as JSON from: '{m}'"],
    "several phone numbers and email addresses": [
        "Collect the contact details (phone numbers and emails) from: '{m}'",
        "Give me every email address and phone number in this text: '{m}'"],
    "a few countries and their capitals": [
        "Extract the country-capital pairs from this text as JSON: '{m}'",
        "Which capitals are mentioned here, and of which countries? '{m}'"],
}
SENTENCE_TOPICS = ["the weather", "shopping", "a holiday", "a birthday", "cooking dinner", "a train journey",
                   "a visit to the doctor", "school homework", "a job interview", "the neighbours", "a football match",
                   "a new phone", "a museum", "the garden", "a lost key", "breakfast", "a concert", "moving house"]
LANGUAGES = [*DOC_LANGUAGES, "Dutch"]  # the document requests' languages, and one more
SUMMARY_ASKS = ["Summarize this report in {n} sentences.\n\n{m}", "Give a one-sentence summary of the text below.\n\n{m}",
                "Write a short summary of the following news item.\n\n{m}",
                "Condense this text into {n} bullet points.\n\n{m}", "TL;DR of this article, please:\n\n{m}"]
RAG_ASK = "Using only the text below, answer the question.\n\nText: {m}\n\nQuestion: {q}"
RAG_QUESTIONS = ["What is the main event described?", "Which numbers appear in the text, and what do they refer to?",
                 "Who is affected, according to the text?", "What happens next, according to the text?",
                 "Where does this take place, and when?", "What reasons does the text give?",
                 "Who said what in the text?", "What problem is described, and how will it be solved?"]
TRANSLATE_ASKS = ["Translate into {lang}: {m}", "Translate into {lang}: {m}", "How do you say this in {lang}? {m}",
                  "Please translate this sentence into {lang}.\n\n{m}"]
MATERIAL_WORDS = {"summarization": (40, 160), "rag": (40, 160), "extraction": (8, 70), "translation": (5, 35)}
SENTENCE_END = re.compile(r"[.!?](?=[\"'”’)]?(\s|$))")


def material_ask(kind: str, rng: random.Random) -> str:
    """The user turn that has the target write the material of a `kind` request."""
    if kind in ("summarization", "rag"):
        return (f"Write a short local news report of four to six sentences about {rng.choice(EVENTS)} in "
                f"{rng.choice(PLACES)}. Include names and numbers. Reply with the report only.")
    if kind == "extraction":
        return f"Write two sentences that mention {rng.choice(list(FACTS))}. Reply with the sentences only."
    if kind == "translation":
        return f"Write one everyday sentence about {rng.choice(SENTENCE_TOPICS)}. Reply with the sentence only."
    raise ValueError(f"unknown quoting kind {kind!r}; expected one of {', '.join(QUOTING_KINDS)}")


def material(kind: str, answer: str) -> str | None:
    """The material in the target's answer: its text up to the last full sentence, on one line for the short kinds,
    without a leading "Here is ..." line; None where it is too short or too long for `kind`."""
    lines = [ln.strip() for ln in answer.strip().splitlines() if ln.strip()]
    if lines and lines[0].lower().startswith(("here is", "here's", "sure")) and lines[0].endswith(":"):
        lines = lines[1:]
    text = ("\n" if kind in ("summarization", "rag") else " ").join(lines).strip().strip('"“”')
    ends = [m.end() for m in SENTENCE_END.finditer(text)]
    if not ends:
        return None
    text = text[:ends[-1]]
    if kind == "translation":  # one sentence
        text = text[:ends[0]]
    low, high = MATERIAL_WORDS[kind]
    return text if low <= len(text.split()) <= high else None


def request(kind: str, ask: str, text: str, rng: random.Random) -> str:
    """The request a user would send about `text`, the material written for `ask` (material_ask's turn)."""
    if kind == "summarization":
        return rng.choice(SUMMARY_ASKS).format(m=text, n=rng.choice(["two", "three"]))
    if kind == "rag":
        return RAG_ASK.format(m=text, q=rng.choice(RAG_QUESTIONS))
    if kind == "extraction":
        fact = next(f for f in FACTS if f in ask)
        return rng.choice(FACTS[fact]).format(m=text)
    if kind == "translation":
        return rng.choice(TRANSLATE_ASKS).format(lang=rng.choice(LANGUAGES), m=text)
    raise ValueError(f"unknown quoting kind {kind!r}; expected one of {', '.join(QUOTING_KINDS)}")
