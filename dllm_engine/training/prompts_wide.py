"""A wide draw of user turns for the draft head's data: many question shapes over a large,
categorised vocabulary, so the head learns how the target answers in general rather than
memorising the replies to a few hundred templated questions (a head trained on templates alone
did that: docs/models.md). The held-out part of this draw uses subjects the training part never
sees (every HELD_OUT_EVERY-th word of each category), so its acceptance measures answers to new
content, not new combinations of old words.
"""

from __future__ import annotations

import random

from dllm_engine.training.prompts import distinct_draws

HELD_OUT_EVERY = 6
HELD_OUT_SEED = 3000  # the held-out turns' draw (scripts/train_draft_head.py, scripts/eval_model.py)

SUBJECTS: dict[str, list[str]] = {
    "food": ["lasagna", "miso soup", "avocado toast", "banana bread", "hummus", "fried rice", "guacamole",
             "risotto", "tofu", "granola", "kimchi", "paella", "falafel", "ramen", "cornbread", "oatmeal",
             "lentil soup", "apple pie", "mac and cheese", "pesto", "quinoa", "brownies", "french toast",
             "spinach", "mushrooms", "sweet potatoes", "blueberries", "mangoes", "olive oil", "honey",
             "yogurt", "peanut butter", "garlic", "ginger", "cinnamon", "popcorn", "lemonade", "green tea"],
    "animal": ["a hedgehog", "a koala", "a jellyfish", "a cheetah", "a hummingbird", "a polar bear", "a gecko",
               "a beaver", "a flamingo", "a squid", "a raccoon", "a bat", "a camel", "a crow", "a seahorse",
               "an ant", "a butterfly", "a salmon", "a sloth", "a panda", "a kangaroo", "a moose", "an eagle",
               "a lobster", "a chameleon", "a goat", "a hamster", "a peacock", "a walrus", "a snail"],
    "place": ["Iceland", "New Zealand", "Scotland", "Vancouver", "Kyoto", "Barcelona", "Cape Town", "Hawaii",
              "the Alps", "the Sahara", "the Amazon", "Venice", "Chicago", "Singapore", "Marrakech", "Havana",
              "Budapest", "Amsterdam", "Edinburgh", "Patagonia", "Bali", "the Grand Canyon", "Vienna", "Oslo",
              "San Francisco", "Florence", "Nairobi", "Montreal", "Athens", "the Himalayas"],
    "object": ["a microwave", "a smartphone", "a dishwasher", "headphones", "a bicycle helmet", "a laptop",
               "a fridge", "a candle", "a wool sweater", "running shoes", "a backpack", "a frying pan",
               "a houseplant", "a printer", "an umbrella", "a toothbrush", "a mattress", "sunglasses",
               "a coffee maker", "a vacuum cleaner", "a water bottle", "a smart speaker", "a watch",
               "a keyboard", "a tent", "a suitcase", "a camera", "a mirror", "a wallet", "a blender"],
    "activity": ["meditation", "rock climbing", "journaling", "surfing", "pottery", "skiing", "birdwatching",
                 "woodworking", "kayaking", "learning to code", "public speaking", "camping", "sewing",
                 "tennis", "ballet", "volunteering", "podcasting", "skateboarding", "calligraphy", "archery",
                 "composting", "bowling", "sailing", "crossword puzzles", "juggling", "boxing", "origami",
                 "stargazing", "singing", "baking sourdough"],
    "concept": ["inflation", "democracy", "artificial intelligence", "the stock market", "recycling",
                "the greenhouse effect", "black holes", "the placebo effect", "compound interest", "jet lag",
                "daylight saving time", "the northern lights", "cryptocurrency", "the ozone layer", "tsunamis",
                "metabolism", "caffeine", "allergies", "antibiotics", "solar panels", "wifi", "GPS",
                "the human genome", "plate tectonics", "the big bang", "gravity waves", "nuclear energy",
                "the food chain", "hibernation", "migration"],
    "job": ["a nurse", "an architect", "a pilot", "a librarian", "a firefighter", "a chef", "an astronaut",
            "a plumber", "a teacher", "a veterinarian", "a journalist", "an electrician", "a lawyer",
            "a dentist", "a farmer", "a pharmacist", "a translator", "a software engineer", "a mechanic",
            "a photographer", "a zookeeper", "a baker", "a judge", "a scientist", "a florist", "a carpenter"],
    "history": ["the moon landing", "the printing press", "the Renaissance", "the Silk Road", "the Vikings",
                "the ancient Olympics", "the Industrial Revolution", "the first airplane", "the Titanic",
                "ancient Rome", "the Aztecs", "the invention of the telephone", "the Great Wall of China",
                "the first computer", "the Stone Age", "the Ottoman Empire", "the Wright brothers",
                "the discovery of penicillin", "the Magna Carta", "the gold rush", "the samurai",
                "the Berlin Wall", "the Maya", "Stonehenge", "the invention of paper"],
    "feeling": ["anxious before a job interview", "homesick", "unmotivated", "overwhelmed with chores",
                "nervous about flying", "grumpy this morning", "jealous of a friend", "stuck on a decision",
                "sleepy after lunch", "excited about a new job", "sad that summer is over",
                "annoyed with my neighbor", "scared of the dark", "hopeful about the future",
                "burned out", "restless tonight", "shy at parties", "grateful today"],
    "sport": ["football", "basketball", "cricket", "golf", "volleyball", "rugby", "table tennis", "badminton",
              "ice hockey", "baseball", "water polo", "fencing", "the marathon", "cycling races", "gymnastics",
              "snowboarding", "wrestling", "rowing", "sumo", "formula one"],
    "art": ["jazz", "opera", "hip hop", "classical music", "impressionism", "poetry", "graffiti",
            "photography", "sculpture", "the violin", "the drums", "the saxophone", "comic books", "theater",
            "animation", "film noir", "folk music", "rock and roll", "watercolor painting", "the harp"],
    "nature": ["a thunderstorm", "a waterfall", "the desert at night", "a coral reef", "a rainforest",
               "fog", "autumn leaves", "a volcano", "a glacier", "the tide", "a full moon", "a meteor shower",
               "hail", "a cave", "a river delta", "the tundra", "cherry blossoms", "mushrooms in a forest",
               "a sunset", "a hurricane"],
}

# each category's question shapes ({x}: a word of that category; {y}: the word without its article)
FRAMES: dict[str, list[str]] = {
    "food": ["How do I make {x}?", "Is {x} good for you?", "What can I eat with {x}?", "Where does {x} come from?",
             "How long does {x} keep in the fridge?", "Give me a quick recipe with {x}.",
             "Why do some people not like {x}?", "What's a healthy alternative to {x}?",
             "Can I freeze {x}?", "What does {x} taste like?"],
    "animal": ["What does {x} eat?", "How long does {x} live?", "Where can I see {x}?", "Is {x} dangerous?",
               "Tell me a fun fact about {x}.", "How does {x} sleep?", "Can {x} be a pet?",
               "How smart is {x}?", "What sound does {x} make?", "How big does {x} get?"],
    "place": ["What should I do in {x}?", "When is the best time to visit {x}?", "What is {x} famous for?",
              "What's the food like in {x}?", "Is {x} expensive to visit?", "What should I pack for {x}?",
              "Tell me about the history of {x}.", "How do people get around in {x}?",
              "Plan me a day in {x}.", "What's the weather like in {x} in spring?"],
    "object": ["How do I clean {x}?", "How long does {x} usually last?", "What should I look for when buying {x}?",
               "Who invented {x}?", "How does {x} work?", "My {y} stopped working. What should I check?",
               "Is it worth fixing {x} or buying a new one?", "How do I recycle {x}?"],
    "activity": ["How do I get started with {x}?", "Is {x} hard to learn?", "What do I need for {x}?",
                 "Why is {x} good for you?", "How much time should I spend on {x} each week?",
                 "What's a common mistake in {x}?", "Can kids do {x}?", "Give me three tips for {x}."],
    "concept": ["What is {x}?", "Explain {x} in simple terms.", "Why does {x} matter?", "How does {x} work?",
                "Who came up with {x}?", "Is {x} good or bad?", "Explain {x} to a ten year old.",
                "What's a common myth about {x}?", "How does {x} affect my daily life?"],
    "job": ["What does {x} do all day?", "How do I become {x}?", "Is being {x} stressful?",
            "What skills does {x} need?", "How much does {x} earn?", "What's the best part of being {x}?"],
    "history": ["Tell me about {x}.", "Why was {x} important?", "When did {x} happen?", "Who was behind {x}?",
                "What's a surprising fact about {x}?", "How did {x} change the world?",
                "Summarize {x} in a few sentences."],
    "feeling": ["I'm {x}. What should I do?", "I feel {x}.", "How can I stop feeling {x}?",
                "Is it normal to be {x}?", "My friend is {x}. How can I help?"],
    "sport": ["What are the rules of {x}?", "Who is the best {x} player ever?", "How do I get better at {x}?",
              "Why is {x} so popular?", "Is {x} a good workout?", "How long does a game of {x} last?"],
    "art": ["Where did {x} come from?", "Recommend something to start with in {x}.", "Why do people love {x}?",
            "How do I learn {x}?", "Who is famous for {x}?", "What makes {x} different?"],
    "nature": ["Why does {x} happen?", "Describe {x} in two sentences.", "Is {x} dangerous?",
               "Write a short poem about {x}.", "Tell me a short story about {x}.", "Where can I see {x}?"],
}
GENERIC_FRAMES = ["Tell me something interesting about {x}.", "What do you know about {x}?",
                  "Can you explain {x} quickly?", "What's your opinion on {x}?", "Say three things about {x}.",
                  "I want to learn about {x}. Where do I start?", "Make up a riddle about {x}.",
                  "Write a limerick about {x}.", "What would a child ask about {x}?",
                  "Give me a surprising fact about {x}.", "Compare {x} and {z}.",
                  "Which is better, {x} or {z}?", "Tell me a joke about {x}."]
OPENERS = ["", "", "", "Hey, ", "Okay, ", "Quick question. ", "So, ", "Hmm, ", "Hi! ", "Um, ", "Can I ask something? "]


def subjects(part: str) -> dict[str, list[str]]:
    """Each category's words for the training part or the held-out part (disjoint)."""
    keep = (lambda i: i % HELD_OUT_EVERY != 0) if part == "train" else (lambda i: i % HELD_OUT_EVERY == 0)
    return {category: [w for i, w in enumerate(words) if keep(i)] for category, words in SUBJECTS.items()}


def _draw(rng: random.Random, words: dict[str, list[str]]) -> str:
    category = rng.choice(list(words))
    if rng.random() < 0.2 and category != "feeling":  # "a joke about homesick" is no question
        frame = rng.choice(GENERIC_FRAMES)
        other = rng.choice([c for c in words if c != "feeling"])
        text = frame.format(x=rng.choice(words[category]), z=rng.choice(words[other]))
    else:
        word = rng.choice(words[category])
        text = rng.choice(FRAMES[category]).format(x=word, y=word.split(" ", 1)[-1])
    opener = rng.choice(OPENERS)
    lower = opener.endswith(", ") and not text.startswith(("I ", "I'm"))  # "Okay, how do I ..."
    return opener + (text[0].lower() + text[1:] if lower else text)


def wide_prompts(count: int, seed: int, part: str) -> list[str]:
    """Up to `count` distinct user turns from the `part` ("train" or "held_out") vocabulary."""
    words = subjects(part)
    return distinct_draws(count, random.Random(seed), lambda rng: _draw(rng, words))
