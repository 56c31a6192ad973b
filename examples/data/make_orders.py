"""Write the "orders" fine-tuning task: a customer's message -> the order as one line of JSON.

Each record is a chat: a system turn with the instruction, the customer's message as the user
turn, and the answer ``{"item": "paper cups", "qty": 3, "city": "Oslo"}`` as the assistant
turn. The messages come from a dozen phrasings; the held-out split (test.jsonl) uses items and
cities that no training record mentions, so it scores the format and the copying, not recall.
The bundled SmolLM2-135M-Instruct answers in some other shape (0% exact match before training).

    python examples/data/make_orders.py [--train 240] [--test 60] [--seed 0] [--out DIR]

The output is the same for the same arguments (files committed in examples/data/orders/).
"""

from __future__ import annotations

import argparse
import json
import os
import random

SYSTEM = "Reply with the order as JSON."

ITEMS = """paper cups|desk lamps|AA batteries|coffee filters|printer paper|office chairs|USB cables
|water bottles|notebooks|soap bars|trash bags|whiteboard markers|sticky notes|light bulbs
|paper towels|ice packs|cardboard boxes|tape rolls|rubber gloves|safety goggles|tea kettles
|paper plates|folding tables|extension cords|mouse pads|glue sticks|envelopes|binder clips
|dish sponges|coat hangers|shipping labels|phone chargers|hard hats|tea towels|wall clocks
|bar stools|laptop stands|floor mats|picture frames|garden hoses|flower pots|bike locks
|yoga mats|hair dryers|candles|pillow cases|bath towels|cereal bars|oil lamps|paint brushes
|screwdrivers|door mats|umbrellas|lunch boxes|spray bottles|ink cartridges|name badges
|first aid kits|wooden spoons|table cloths|key rings|hand fans|desk fans|oven mitts
|measuring tapes|sand bags|fire blankets|ear plugs|soup bowls|rain jackets|wine glasses
|coffee mugs|cutting boards|frying pans|shower curtains|bed sheets|alarm clocks|power strips
|headphones|webcams|keyboards|monitors|filing cabinets|storage bins|push pins|rubber bands
|scissors|rulers|pencil cases|backpacks|suitcases|tool boxes|step ladders|paint rollers
|work boots|winter hats|wool socks|sun hats|beach towels|tent pegs|sleeping bags|camp stoves
|bird feeders|watering cans|plant labels|seed packets|dog leashes|cat bowls|fish tanks""".replace(
    "\n", ""
)

CITIES = """Oslo|Lisbon|Denver|Nairobi|Osaka|Porto|Krakow|Austin|Dublin|Quito|Seville|Leeds
|Tampere|Bergen|Ghent|Lyon|Turin|Malmo|Cork|Graz|Basel|Tartu|Riga|Vilnius|Split|Bilbao
|Utrecht|Aarhus|Brno|Lille|Geneva|Nantes|Bremen|Leipzig|Toledo|Fresno|Tucson|Halifax
|Calgary|Regina|Hobart|Perth|Dunedin|Nagoya|Busan|Hanoi|Cebu|Pune|Mysore|Kandy|Accra
|Dakar|Tunis|Fez|Luxor|Mombasa|Arusha|Durban|Windhoek|Lima|Cusco|Recife|Rosario|Montevideo
|Oaxaca|Merida|Havana|Boise|Omaha|Tulsa|Reno|Salem|Madrid|Paris|Berlin|Vienna|Prague|Warsaw
|Athens|Rome|Milan|Naples|Zurich|Munich|Hamburg|Cologne|Antwerp|Brussels|Rotterdam|Bristol
|Glasgow|Cardiff|Belfast|Helsinki|Stockholm|Gothenburg|Tallinn|Sofia|Zagreb|Ljubljana
|Budapest|Bucharest|Istanbul|Izmir|Cairo|Casablanca|Marrakesh|Lagos|Kampala|Kigali|Lusaka""".replace(
    "\n", ""
)

TEMPLATES = [
    "Please send {qty} {item} to {city}.",
    "Hi, could I get {qty} {item} delivered to {city}?",
    "We need {qty} {item} at our {city} office by Friday.",
    "Order for {city}: {qty} {item}.",
    "Ship {qty} {item} to {city}, thanks!",
    "Can you deliver {qty} {item} to the store in {city}?",
    "Our {city} branch is out of {item}, please send {qty}.",
    "I'd like to order {qty} {item}. Delivery address is in {city}.",
    "{qty} {item} for {city}, as soon as possible.",
    "Hello! Please ship {item} to {city}, quantity {qty}.",
    "Deliver to {city}: {item} x{qty}",
    "Could you put {qty} {item} on the next truck to {city}?",
]


def record(rng: random.Random, item: str, city: str) -> dict:
    """One chat record: a message drawn from the templates and its JSON answer."""
    qty = rng.randint(1, 60)
    text = rng.choice(TEMPLATES).format(qty=qty, item=item, city=city)
    answer = json.dumps({"item": item, "qty": qty, "city": city})
    return {
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": text},
            {"role": "assistant", "content": answer},
        ]
    }


def make(n_train: int, n_test: int, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """(train, test) records; test's items and cities never occur in train."""
    rng = random.Random(seed)
    items, cities = ITEMS.split("|"), CITIES.split("|")
    rng.shuffle(items)
    rng.shuffle(cities)
    ki, kc = len(items) // 4, len(cities) // 4  # a quarter of each pool is held out
    test = records(rng, n_test, items[:ki], cities[:kc])
    train = records(rng, n_train, items[ki:], cities[kc:])
    return train, test


def records(rng: random.Random, n: int, items: list[str], cities: list[str]) -> list[dict]:
    """n records that use every item and city about equally often (in a shuffled order)."""

    def cycle(pool: list[str]) -> list[str]:
        out: list[str] = []
        while len(out) < n:
            out += rng.sample(pool, len(pool))
        return out[:n]

    return [record(rng, i, c) for i, c in zip(cycle(items), cycle(cities))]


def main() -> None:
    """Write train.jsonl and test.jsonl."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--train", type=int, default=240, help="training records (default 240)")
    p.add_argument("--test", type=int, default=60, help="held-out records (default 60)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "orders"))
    args = p.parse_args()
    train, test = make(args.train, args.test, args.seed)
    os.makedirs(args.out, exist_ok=True)
    for name, recs in (("train", train), ("test", test)):
        path = os.path.join(args.out, f"{name}.jsonl")
        with open(path, "w", encoding="utf-8", newline="\n") as f:
            f.writelines(json.dumps(r) + "\n" for r in recs)
        print(f"{path}: {len(recs)} records")


if __name__ == "__main__":
    main()
