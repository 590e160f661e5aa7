"""Voice-assistant-style user turns, made from templates with a seeded generator.

Questions, requests and small talk of the kind people say to a voice assistant. The
factual sanity set (SANITY_QUESTIONS) is for evaluation only and never reaches training.
"""

from __future__ import annotations

import random

VOICE_SYSTEM_PROMPT = (
    "You are a friendly voice assistant. Answer in one to three short spoken sentences. "
    "Do not use lists, markdown or emoji."
)

_COUNTRIES = ["Spain", "Italy", "Germany", "Japan", "Canada", "Brazil", "Egypt", "India", "Kenya", "Mexico",
              "Norway", "Sweden", "Greece", "Portugal", "Australia", "Argentina", "Chile", "Peru", "Turkey",
              "Poland", "Ireland", "Austria", "Thailand", "Vietnam", "China", "Russia", "Morocco", "Nigeria",
              "Cuba", "Finland", "Denmark", "Belgium", "Netherlands", "Switzerland", "Hungary", "Indonesia"]
_TOPICS = ["photosynthesis", "gravity", "the moon", "volcanoes", "rain", "rainbows", "electricity", "the internet",
           "black holes", "dinosaurs", "the ocean", "earthquakes", "vaccines", "bees", "coffee", "chocolate",
           "the heart", "sleep", "music", "the sun", "clouds", "tides", "magnets", "plants", "thunder", "snow",
           "the brain", "bread", "cheese", "wind", "glaciers", "deserts", "whales", "owls", "batteries",
           "airplanes", "bicycles", "trains", "computers", "robots", "the pyramids", "the Roman empire"]
_TASKS = ["boil an egg", "make tea", "fall asleep faster", "stay focused", "learn a new language",
          "save money", "cook rice", "keep plants alive", "start running", "write a good email",
          "make pancakes", "clean a laptop screen", "remember names", "reduce stress", "tie a tie",
          "bake bread", "plan a trip", "study for an exam", "make friends in a new city", "drink more water",
          "fix a flat bike tire", "take better photos", "wake up early", "organize my desk", "be more patient"]
_THINGS = ["a cat", "a dog", "a rainy day", "the ocean", "a robot", "a dragon", "a small town", "the stars",
           "a birthday", "a lost key", "a friendly ghost", "winter", "a garden", "a train ride", "a pirate"]
_ANIMALS = ["cats", "dogs", "elephants", "dolphins", "penguins", "owls", "lions", "horses", "bees", "octopuses",
            "sharks", "frogs", "parrots", "wolves", "foxes", "rabbits", "turtles", "giraffes"]
_SMALL_TALK = [
    "Hi there!", "Hello, how are you today?", "Good morning!", "What's your name?", "Are you a robot?",
    "Thanks for your help.", "Can you hear me?", "What can you do?", "I'm feeling a bit tired today.",
    "I had a great day today.", "Do you like music?", "What's your favorite color?", "Tell me something nice.",
    "I'm bored.", "Good night!", "How was your day?", "Who made you?", "Are you smart?", "See you later!",
    "I just got a new puppy.", "It's raining outside.", "I passed my exam!", "I can't sleep.",
]

_TEMPLATES = [
    ("What is the capital of {country}?", {"country": _COUNTRIES}),
    ("What language do people speak in {country}?", {"country": _COUNTRIES}),
    ("Tell me one interesting fact about {country}.", {"country": _COUNTRIES}),
    ("What is {topic}?", {"topic": _TOPICS}),
    ("Can you explain {topic} in simple words?", {"topic": _TOPICS}),
    ("Why is {topic} important?", {"topic": _TOPICS}),
    ("Give me a fun fact about {topic}.", {"topic": _TOPICS}),
    ("How do I {task}?", {"task": _TASKS}),
    ("Any tips to {task}?", {"task": _TASKS}),
    ("What's the easiest way to {task}?", {"task": _TASKS}),
    ("Tell me a short story about {thing}.", {"thing": _THINGS}),
    ("Write a two line poem about {thing}.", {"thing": _THINGS}),
    ("Tell me a joke about {animals}.", {"animals": _ANIMALS}),
    ("What do {animals} eat?", {"animals": _ANIMALS}),
    ("Where do {animals} live?", {"animals": _ANIMALS}),
    ("Are {animals} smart?", {"animals": _ANIMALS}),
    ("What is {a} plus {b}?", {"a": list(range(1, 50)), "b": list(range(1, 50))}),
    ("What is {a} times {b}?", {"a": list(range(2, 13)), "b": list(range(2, 13))}),
    ("What is {a} minus {b}?", {"a": list(range(20, 100)), "b": list(range(1, 20))}),
    ("How many days are in {period}?", {"period": ["a week", "a year", "a leap year", "two weeks", "June", "February"]}),
    ("Should I {choice} today?", {"choice": ["go for a walk", "read a book", "call my mom", "cook dinner", "rest"]}),
    ("Recommend a {kind} for tonight.", {"kind": ["movie", "book", "dinner", "board game", "song", "podcast"]}),
    ("What's a good name for {pet}?", {"pet": ["a cat", "a dog", "a goldfish", "a hamster", "a parrot"]}),
    ("{small_talk}", {"small_talk": _SMALL_TALK}),
    ("How far is {country} from {country2}?", {"country": _COUNTRIES, "country2": _COUNTRIES}),
    ("What food is {country} famous for?", {"country": _COUNTRIES}),
    ("What's the weather usually like in {country}?", {"country": _COUNTRIES}),
    ("How does {topic} work?", {"topic": _TOPICS}),
    ("Who discovered {topic}?", {"topic": _TOPICS}),
    ("Tell me three things about {topic}.", {"topic": _TOPICS}),
    ("Explain {topic} to a five year old.", {"topic": _TOPICS}),
    ("What is the difference between {animals} and {animals2}?", {"animals": _ANIMALS, "animals2": _ANIMALS}),
    ("How long do {animals} live?", {"animals": _ANIMALS}),
    ("I want to {task}. Where do I start?", {"task": _TASKS}),
    ("Is it hard to {task}?", {"task": _TASKS}),
    ("Give me a quick tip to {task}.", {"task": _TASKS}),
    ("Tell me a bedtime story about {thing}.", {"thing": _THINGS}),
    ("Describe {thing} in one sentence.", {"thing": _THINGS}),
    ("What is {a} divided by {b}?", {"a": [12, 20, 36, 48, 60, 81, 100, 144], "b": [2, 3, 4, 6]}),
    ("Set a timer for {minutes} minutes.", {"minutes": [1, 2, 5, 10, 15, 20, 30, 45]}),
    ("Remind me to {errand} tomorrow.", {"errand": ["buy milk", "call the dentist", "water the plants",
                                                   "pay the rent", "send the report", "walk the dog"]}),
    ("What time is it in {country}?", {"country": _COUNTRIES}),
    ("Can you help me {help}?", {"help": ["plan dinner", "write a birthday message", "pick a gift",
                                           "name my band", "relax", "think of a hobby", "choose a book"]}),
    ("What does the word {word} mean?", {"word": ["serendipity", "ephemeral", "resilient", "curious", "nostalgia",
                                                   "gravity", "empathy", "photosynthesis", "algorithm"]}),
    ("Translate {phrase} into {language}.", {"phrase": ["hello", "thank you", "good morning", "see you soon"],
                                             "language": ["Spanish", "French", "German", "Italian"]}),
]

# What people say next, once the assistant has answered ({topic} etc. as above).
_FOLLOW_UPS = [
    ("Tell me more.", {}), ("Why?", {}), ("Can you say that shorter?", {}), ("Really? How come?", {}),
    ("Thanks! And what about {country}?", {"country": _COUNTRIES}), ("Okay. What is {topic}?", {"topic": _TOPICS}),
    ("Interesting. Give me another example.", {}), ("I don't understand. Can you explain it again?", {}),
    ("Great, thank you!", {}), ("And how do I {task}?", {"task": _TASKS}), ("What do {animals} eat?", {"animals": _ANIMALS}),
    ("That's funny. Tell me another one.", {}), ("Is that true?", {}), ("What is {a} plus {b}?", {"a": list(range(1, 30)), "b": list(range(1, 30))}),
]
# What people say when they cut the assistant off mid-reply.
_BARGE_INS = [
    ("Stop. What is the capital of {country}?", {"country": _COUNTRIES}),
    ("Wait, actually, what is {a} plus {b}?", {"a": list(range(1, 30)), "b": list(range(1, 30))}),
    ("Sorry, can you tell me about {topic} instead?", {"topic": _TOPICS}),
    ("Okay, okay. How do I {task}?", {"task": _TASKS}), ("Never mind. Tell me a joke about {animals}.", {"animals": _ANIMALS}),
    ("Hold on. Where do {animals} live?", {"animals": _ANIMALS}), ("Stop, that's enough. Thanks.", {}),
    ("No, I meant {topic}.", {"topic": _TOPICS}),
]
# How the voice app shows an assistant turn the user cut off (voice_app.core.conversation)
INTERRUPTED_SUFFIX = "… [interrupted]"

SANITY_QUESTIONS: list[tuple[str, list[str]]] = [
    ("What is the capital of France?", ["paris"]),
    ("What is the capital of the United Kingdom?", ["london"]),
    ("What is the capital of Italy?", ["rome"]),
    ("What is the capital of Japan?", ["tokyo"]),
    ("What is the capital of Germany?", ["berlin"]),
    ("What is the capital of Spain?", ["madrid"]),
    ("What is the capital of Russia?", ["moscow"]),
    ("What is the capital of Egypt?", ["cairo"]),
    ("What is two plus two?", ["4", "four"]),
    ("What is 10 plus 5?", ["15", "fifteen"]),
    ("What is 3 times 3?", ["9", "nine"]),
    ("What is 100 minus 1?", ["99", "ninety-nine", "ninety nine"]),
    ("How many days are in a week?", ["7", "seven"]),
    ("How many months are in a year?", ["12", "twelve"]),
    ("How many legs does a spider have?", ["8", "eight"]),
    ("How many legs does a dog have?", ["4", "four"]),
    ("What color is the sky on a clear day?", ["blue"]),
    ("What color is grass?", ["green"]),
    ("What do bees make?", ["honey"]),
    ("What is frozen water called?", ["ice"]),
    ("What is the largest planet in our solar system?", ["jupiter"]),
    ("Which planet is known as the red planet?", ["mars"]),
    ("What star is at the center of our solar system?", ["sun"]),
    ("What gas do plants absorb from the air?", ["carbon dioxide", "co2"]),
    ("What is the boiling point of water in Celsius?", ["100"]),
    ("Who wrote Romeo and Juliet?", ["shakespeare"]),
    ("What is the opposite of hot?", ["cold"]),
    ("What animal is known as the king of the jungle?", ["lion"]),
    ("How many hours are in a day?", ["24", "twenty-four", "twenty four"]),
    ("What is the largest ocean on Earth?", ["pacific"]),
]


def _fill(rng: random.Random, templates: list) -> str:
    template, slots = rng.choice(templates)
    return template.format(**{name: rng.choice(values) for name, values in slots.items()})


def voice_prompts(count: int, seed: int) -> list[str]:
    """`count` distinct user turns drawn from the templates with a seeded generator."""
    return distinct_draws(count, random.Random(seed), lambda rng: _fill(rng, _TEMPLATES), frozenset())


def distinct_draws(count: int, rng: random.Random, draw, exclude: frozenset[str] | set[str] = frozenset()) -> list[str]:
    """Up to `count` distinct draws (never a sanity question or an excluded one), shuffled."""
    seen: set[str] = set()
    sanity = {q for q, _ in SANITY_QUESTIONS}
    attempts = 0
    while len(seen) < count and attempts < count * 50:
        attempts += 1
        text = draw(rng)
        if text not in sanity and text not in exclude:
            seen.add(text)
    prompts = sorted(seen)
    rng.shuffle(prompts)
    return prompts


def second_turn(first: list[dict], reply: str, rng: random.Random) -> list[dict]:
    """A conversation one turn on: the first turn answered, then a follow-up, or (one time in
    three) the reply cut off part way and a new question over it, as after a barge-in."""
    if rng.random() < 1 / 3 and len(reply.split()) > 4:
        words = reply.split()
        heard = " ".join(words[: rng.randint(2, max(2, len(words) - 2))])
        return first + [{"role": "assistant", "content": heard + INTERRUPTED_SUFFIX},
                        {"role": "user", "content": _fill(rng, _BARGE_INS)}]
    return first + [{"role": "assistant", "content": reply}, {"role": "user", "content": _fill(rng, _FOLLOW_UPS)}]


def conversation(prompt: str, voice_system: bool) -> list[dict]:
    """Half the data carries the voice system prompt (as the voice app sends), half the model's own."""
    messages = [{"role": "system", "content": VOICE_SYSTEM_PROMPT}] if voice_system else []
    return messages + [{"role": "user", "content": prompt}]


# ---- a broader draw: more kinds of turns, for the draft head's data ------------------------------
# (separate lists, so voice_prompts' draws, and the held-out set made from them, stay as they were)
_PEOPLE = ["Albert Einstein", "Marie Curie", "Isaac Newton", "Leonardo da Vinci", "William Shakespeare",
           "Cleopatra", "Napoleon", "Mozart", "Ada Lovelace", "Charles Darwin", "Nelson Mandela", "Frida Kahlo",
           "Galileo", "Beethoven", "Amelia Earhart", "Nikola Tesla", "Jane Austen", "Gandhi", "Picasso"]
_FOODS = ["pizza", "sushi", "pasta", "tacos", "curry", "soup", "salad", "pancakes", "dumplings", "bread",
          "rice", "noodles", "ice cream", "cookies", "a sandwich", "an omelette", "a smoothie", "chili"]
_PLACES = ["Paris", "Tokyo", "New York", "London", "Rome", "Sydney", "Cairo", "Rio", "Berlin", "Madrid",
           "Toronto", "Mumbai", "Istanbul", "Lisbon", "Prague", "Seoul", "Bangkok", "Mexico City", "Dublin"]
_HOBBIES = ["painting", "chess", "gardening", "knitting", "running", "swimming", "cooking", "photography",
            "yoga", "guitar", "piano", "hiking", "reading", "drawing", "dancing", "baking", "cycling", "fishing"]
_SCIENCE = ["atoms", "DNA", "evolution", "the solar system", "climate change", "light", "sound", "energy",
            "friction", "the water cycle", "earthquakes", "the immune system", "photosynthesis", "stars",
            "volcanoes", "oxygen", "electricity", "magnetism", "the speed of light", "gravity on the moon"]
_FEELINGS = ["nervous about tomorrow", "really happy", "a little sad", "stressed at work", "excited for the weekend",
             "tired after a long day", "lonely tonight", "proud of myself", "worried about an exam", "bored"]
_UNITS = [("kilometers", "miles"), ("pounds", "kilograms"), ("Celsius", "Fahrenheit"), ("cups", "liters"),
          ("inches", "centimeters"), ("hours", "minutes"), ("feet", "meters")]
_BROAD_TEMPLATES = [
    ("Who was {person}?", {"person": _PEOPLE}),
    ("What is {person} famous for?", {"person": _PEOPLE}),
    ("Tell me something interesting about {person}.", {"person": _PEOPLE}),
    ("How do I make {food}?", {"food": _FOODS}),
    ("Is {food} healthy?", {"food": _FOODS}),
    ("What goes well with {food}?", {"food": _FOODS}),
    ("What should I see in {place}?", {"place": _PLACES}),
    ("What is {place} known for?", {"place": _PLACES}),
    ("Is {place} a good place to visit in winter?", {"place": _PLACES}),
    ("How do I get started with {hobby}?", {"hobby": _HOBBIES}),
    ("Why do people enjoy {hobby}?", {"hobby": _HOBBIES}),
    ("Give me one tip for {hobby}.", {"hobby": _HOBBIES}),
    ("How does {science} work?", {"science": _SCIENCE}),
    ("Explain {science} in one sentence.", {"science": _SCIENCE}),
    ("What would happen without {science}?", {"science": _SCIENCE}),
    ("I'm feeling {feeling}.", {"feeling": _FEELINGS}),
    ("I'm {feeling}. Any advice?", {"feeling": _FEELINGS}),
    ("How many {question}?", {"question": [f"{to} are in {n} {unit}" for unit, to in _UNITS for n in range(1, 13)]}),
    ("What is {a} percent of {b}?", {"a": [5, 10, 20, 25, 50, 75], "b": [40, 80, 100, 200, 60, 120]}),
    ("If I have {a} apples and eat {b}, how many are left?", {"a": list(range(5, 20)), "b": list(range(1, 5))}),
    ("What is the square root of {n}?", {"n": [4, 9, 16, 25, 36, 49, 64, 81, 100, 144]}),
    ("Spell the word {word}.", {"word": ["necessary", "rhythm", "beautiful", "Wednesday", "library", "science"]}),
    ("What rhymes with {word}?", {"word": ["cat", "moon", "light", "tree", "blue", "day", "song", "heart"]}),
    ("Can you give me a synonym for {word}?", {"word": ["happy", "big", "fast", "smart", "tired", "angry"]}),
    ("What is the opposite of {word}?", {"word": ["early", "light", "full", "open", "strong", "quiet", "rich"]}),
    ("Tell me a fun fact about {animals}.", {"animals": _ANIMALS}),
    ("Why do {animals} sleep so much?", {"animals": ["cats", "dogs", "koalas", "lions", "sloths", "bats"]}),
    ("Can {animals} swim?", {"animals": _ANIMALS}),
    ("What's a good {kind} to learn?", {"kind": ["language", "instrument", "sport", "skill", "dance"]}),
    ("Should I learn {hobby} or {hobby2}?", {"hobby": _HOBBIES, "hobby2": _HOBBIES}),
    ("What's the difference between {food} and {food2}?", {"food": _FOODS, "food2": _FOODS}),
    ("Compare {place} and {place2} for a holiday.", {"place": _PLACES, "place2": _PLACES}),
    ("Make up a riddle about {thing}.", {"thing": _THINGS}),
    ("Describe {place} in three words.", {"place": _PLACES}),
    ("Tell me a happy story about {thing}.", {"thing": _THINGS}),
    ("Write a haiku about {topic}.", {"topic": _TOPICS}),
    ("What time should I go to bed if I wake up at {hour}?", {"hour": ["six", "seven", "five thirty", "eight"]}),
    ("How long should I {activity}?", {"activity": ["nap", "exercise each day", "boil pasta", "study at once",
                                                    "brush my teeth", "steep green tea", "meditate"]}),
    ("What do you think about {topic}?", {"topic": _TOPICS + _SCIENCE}),
    ("Is it true that {claim}?", {"claim": ["goldfish have a three second memory", "we only use ten percent of "
                                            "our brain", "lightning never strikes twice", "bats are blind",
                                            "bulls hate the color red", "the Great Wall is visible from space"]}),
]
_BROAD_FOLLOW_UPS = _FOLLOW_UPS + [
    ("Can you give me an example?", {}), ("What else should I know?", {}), ("How long does that take?", {}),
    ("Is that expensive?", {}), ("And why is that?", {}), ("Okay, and what about {food}?", {"food": _FOODS}),
    ("Who was {person}, then?", {"person": _PEOPLE}), ("Nice. What should I see in {place}?", {"place": _PLACES}),
    ("Can you say it again, slower?", {}), ("What's the first step?", {}), ("Thanks. One more tip?", {}),
]
# the voice server's default instructions (voice_app/settings.py): what its sessions send
SERVER_SYSTEM_PROMPT = (
    "You are a friendly voice assistant. Your words are spoken aloud, so answer in one or two "
    "short, natural sentences. Never use lists, markdown, code, emoji or URLs."
)


def broad_voice_prompts(count: int, seed: int, exclude: set[str] = frozenset()) -> list[str]:
    """`count` distinct user turns from both template sets (the broader one twice as often)."""
    return distinct_draws(count, random.Random(seed),
                     lambda rng: _fill(rng, _BROAD_TEMPLATES if rng.random() < 2 / 3 else _TEMPLATES), exclude)


def broad_conversation(prompt: str, rng: random.Random) -> list[dict]:
    """A first turn under one of the system prompts voice clients send, or none."""
    system = rng.choice([VOICE_SYSTEM_PROMPT, SERVER_SYSTEM_PROMPT, None])
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]


def broad_follow_up(first: list[dict], reply: str, rng: random.Random) -> list[dict]:
    """second_turn over the broader follow-ups."""
    if rng.random() < 1 / 3 and len(reply.split()) > 4:
        return second_turn(first, reply, rng)
    return first + [{"role": "assistant", "content": reply}, {"role": "user", "content": _fill(rng, _BROAD_FOLLOW_UPS)}]
