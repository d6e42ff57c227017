"""Build specdec's ``json-schema`` prompt set: JSON generation against schemas (``specdec eval --dataset json-schema``).

    python benchmarks/json_schema_prompts.py            # rewrites specdec/prompts/data/json_schema.jsonl
    python benchmarks/json_schema_prompts.py --check    # exit 1 if the file differs from what this script builds

The schemas and prompts live here once; each JSONL row repeats its schema twice, in the prompt text (as a user
would paste it into a chat) and in the ``schema`` field (what ``--json-schema`` constrains and validates against).
Three groups (``category``): ``extraction`` (a short passage written for this set, to be turned into a record),
``tool_call`` (a request to be turned into a function call) and ``generation`` (a record to be composed).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parents[1] / "specdec" / "prompts" / "data" / "json_schema.jsonl"

_DATE = r"^\d{4}-\d{2}-\d{2}$"
_TIME = r"^\d{2}:\d{2}$"
_DATETIME = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}$"
_CURRENCY = {"type": "string", "enum": ["USD", "EUR", "GBP", "JPY", "CHF", "CAD"]}


def _obj(properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    """An object schema with every property required unless told otherwise, and no other properties."""
    return {"type": "object", "properties": properties,
            "required": list(properties) if required is None else required, "additionalProperties": False}


def _str(**kw: Any) -> dict[str, Any]:
    return {"type": "string", **kw}


def _list(items: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return {"type": "array", "items": items, **kw}


SCHEMAS: dict[str, dict[str, Any]] = {
    "person": _obj({
        "name": _str(),
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "occupation": _str(),
        "languages": _list(_str(), minItems=1),
        "contact": _obj({"email": _str(), "phone": _str()}, required=[]),
    }, required=["name", "age", "occupation", "languages"]),
    "event": _obj({
        "title": _str(),
        "category": _str(enum=["conference", "meetup", "workshop", "concert", "sports", "fundraiser", "other"]),
        "date": _str(pattern=_DATE),
        "start_time": _str(pattern=_TIME),
        "duration_minutes": {"type": "integer", "minimum": 1},
        "location": _obj({"venue": _str(), "city": _str()}),
        "ticket_price": {"type": "number", "minimum": 0},
        "organizers": _list(_str()),
    }, required=["title", "category", "date", "start_time", "location"]),
    "invoice": _obj({
        "invoice_number": _str(),
        "issue_date": _str(pattern=_DATE),
        "vendor": _str(),
        "customer": _str(),
        "currency": _CURRENCY,
        "line_items": _list(_obj({
            "description": _str(),
            "quantity": {"type": "integer", "minimum": 1},
            "unit_price": {"type": "number", "minimum": 0},
        }), minItems=1),
        "total": {"type": "number", "minimum": 0},
        "paid": {"type": "boolean"},
    }),
    "recipe": _obj({
        "name": _str(),
        "servings": {"type": "integer", "minimum": 1, "maximum": 50},
        "prep_minutes": {"type": "integer", "minimum": 0},
        "difficulty": _str(enum=["easy", "medium", "hard"]),
        "vegetarian": {"type": "boolean"},
        "ingredients": _list(_obj({
            "item": _str(),
            "quantity": {"type": "number", "minimum": 0},
            "unit": _str(enum=["g", "kg", "ml", "l", "tsp", "tbsp", "cup", "piece", "pinch"]),
        }), minItems=1),
        "steps": _list(_str(), minItems=1),
    }),
    "bug_report": _obj({
        "title": _str(),
        "severity": _str(enum=["low", "medium", "high", "critical"]),
        "component": _str(),
        "steps_to_reproduce": _list(_str(), minItems=1),
        "expected": _str(),
        "actual": _str(),
        "environment": _obj({"os": _str(), "app_version": _str()}),
        "regression": {"type": "boolean"},
    }),
    "calendar_entry": _obj({
        "title": _str(),
        "start": _str(pattern=_DATETIME),
        "end": _str(pattern=_DATETIME),
        "all_day": {"type": "boolean"},
        "recurrence": _str(enum=["none", "daily", "weekly", "monthly", "yearly"]),
        "reminders_minutes": _list({"type": "integer", "minimum": 0}),
        "participants": _list(_obj({"name": _str(), "email": _str()}, required=["name"])),
        "location": _str(),
    }, required=["title", "start", "end", "all_day", "recurrence"]),
    "address": _obj({
        "recipient": _str(),
        "street": _str(),
        "city": _str(),
        "postal_code": _str(),
        "region": _str(),
        "country_code": _str(pattern=r"^[A-Z]{2}$"),
    }, required=["recipient", "street", "city", "postal_code", "country_code"]),
    "movie_review": _obj({
        "title": _str(),
        "year": {"type": "integer", "minimum": 1888, "maximum": 2100},
        "director": _str(),
        "rating": {"type": "number", "minimum": 0, "maximum": 10},
        "sentiment": _str(enum=["positive", "mixed", "negative"]),
        "pros": _list(_str()),
        "cons": _list(_str()),
        "recommend": {"type": "boolean"},
    }),
    "flight_booking": _obj({
        "booking_reference": _str(pattern=r"^[A-Z0-9]{6}$"),
        "passengers": _list(_obj({
            "first_name": _str(),
            "last_name": _str(),
            "type": _str(enum=["adult", "child", "infant"]),
        }), minItems=1),
        "segments": _list(_obj({
            "flight_number": _str(),
            "from": _str(pattern=r"^[A-Z]{3}$"),
            "to": _str(pattern=r"^[A-Z]{3}$"),
            "departure": _str(pattern=_DATETIME),
        }), minItems=1),
        "cabin": _str(enum=["economy", "premium_economy", "business", "first"]),
        "total_price": _obj({"amount": {"type": "number", "minimum": 0}, "currency": _CURRENCY}),
    }),
    "product": _obj({
        "name": _str(),
        "sku": _str(),
        "price": {"type": "number", "minimum": 0},
        "currency": _CURRENCY,
        "in_stock": {"type": "boolean"},
        "categories": _list(_str(), minItems=1),
        "dimensions_cm": _obj({"width": {"type": "number"}, "height": {"type": "number"},
                               "depth": {"type": "number"}}),
        "rating": {"type": "number", "minimum": 0, "maximum": 5},
    }, required=["name", "price", "currency", "in_stock", "categories"]),
    "get_weather_call": _obj({
        "name": _str(enum=["get_weather"]),
        "arguments": _obj({
            "location": _str(),
            "unit": _str(enum=["celsius", "fahrenheit"]),
            "days": {"type": "integer", "minimum": 1, "maximum": 14},
        }, required=["location", "unit"]),
    }),
    "send_email_call": _obj({
        "name": _str(enum=["send_email"]),
        "arguments": _obj({
            "to": _list(_str(), minItems=1),
            "cc": _list(_str()),
            "subject": _str(),
            "body": _str(),
            "priority": _str(enum=["low", "normal", "high"]),
        }, required=["to", "subject", "body"]),
    }),
    "search_products_call": _obj({
        "name": _str(enum=["search_products"]),
        "arguments": _obj({
            "query": _str(),
            "category": _str(enum=["electronics", "books", "clothing", "home", "sports", "toys"]),
            "max_price": {"type": "number", "minimum": 0},
            "sort_by": _str(enum=["relevance", "price_asc", "price_desc", "rating"]),
            "limit": {"type": "integer", "minimum": 1, "maximum": 50},
        }, required=["query"]),
    }),
    "assistant_action": {"anyOf": [
        _obj({"tool": _str(enum=["set_reminder"]),
              "arguments": _obj({"text": _str(), "at": _str(pattern=_DATETIME)})}),
        _obj({"tool": _str(enum=["convert_currency"]),
              "arguments": _obj({"amount": {"type": "number"}, "from": _CURRENCY, "to": _CURRENCY})}),
        _obj({"tool": _str(enum=["search_flights"]),
              "arguments": _obj({"origin": _str(pattern=r"^[A-Z]{3}$"), "destination": _str(pattern=r"^[A-Z]{3}$"),
                                 "date": _str(pattern=_DATE),
                                 "passengers": {"type": "integer", "minimum": 1, "maximum": 9}},
                                required=["origin", "destination", "date"])}),
    ]},
}

_TOOLS = {
    "get_weather_call": "You can call the function get_weather(location, unit, days) which returns a forecast.",
    "send_email_call": "You can call the function send_email(to, cc, subject, body, priority) which sends an email.",
    "search_products_call": ("You can call the function search_products(query, category, max_price, sort_by, limit) "
                             "which searches an online shop."),
    "assistant_action": ("You are an assistant with three tools: set_reminder(text, at), "
                         "convert_currency(amount, from, to) and search_flights(origin, destination, date, "
                         "passengers). Pick the one tool that serves the request."),
}

# (category, schema, instruction, passage or None)
PROMPTS: list[tuple[str, str, str, str | None]] = [
    # --- extraction: a passage written for this set, turned into a record -------------------------------
    ("extraction", "person", "Extract the person described in this passage.",
     "Dr. Amara Okafor is a 42-year-old marine biologist based in Lagos. She grew up speaking Igbo and English and "
     "learnt Portuguese during three years of fieldwork off the coast of Brazil. Colleagues reach her at "
     "amara.okafor@oceanlab.example."),
    ("extraction", "person", "Extract the person described in this passage.",
     "At 29, Lukas Brandt already runs his own bakery in Freiburg. He switches between German and French with his "
     "customers from across the border, and takes orders by phone on +49 761 555 0192."),
    ("extraction", "event", "Extract the event announced in this passage.",
     "Join us for the Riverside Python Meetup on 14 March 2025! Talks start at 18:30 and run for about two hours at "
     "the Old Mill Co-working Space in Leeds. Entry is free; the evening is organised by Priya Shah and Tom Ellis."),
    ("extraction", "event", "Extract the event announced in this passage.",
     "The Blue Lantern Quartet plays an evening of modal jazz at the Harbour Hall, Halifax, on 2025-06-21. Doors "
     "open at 19:00 and the concert begins at 19:30, lasting 90 minutes. Tickets cost 35 dollars."),
    ("extraction", "invoice", "Extract the invoice in this email.",
     "Hello Ms Reyes, please find below invoice INV-2041 dated 2025-02-03 from Greenleaf Gardening Ltd. It covers "
     "4 hours of hedge trimming at 40.00 GBP per hour and 2 bags of mulch at 12.50 GBP each, 185.00 GBP in total. "
     "Payment has not been received yet."),
    ("extraction", "invoice", "Extract the invoice in this email.",
     "Invoice 2025-117 (issued 2025-04-30) from Nordlicht Consulting GmbH to Bergmann Logistics AG: one software "
     "architecture review at 2400 EUR and 3 training days at 900 EUR per day. Total 5100 EUR, settled by bank "
     "transfer on 12 May."),
    ("extraction", "bug_report", "Turn this user message into a bug report.",
     "Since updating PhotoShelf to 3.2.0 on my Pixel 7 (Android 14), the app crashes every time I tap 'Share' on an "
     "album. Open an album, tap the share icon, pick any target: the app closes instantly. It used to open the share "
     "sheet in 3.1. This blocks me from sending photos to my family."),
    ("extraction", "bug_report", "Turn this issue text into a bug report.",
     "CSV export drops the last row. Steps: create a report with at least two rows in Ledgerly 1.8.4 on macOS 14, "
     "choose File > Export > CSV, open the file. Expected every row of the report; the file is missing the final "
     "row. Annoying but a manual copy works around it. I don't think 1.8.3 did this."),
    ("extraction", "address", "Extract the postal address from this note.",
     "Please ship the replacement headphones to Marta Kowalski, ul. Lipowa 17/4, 31-052 Krakow, Lesser Poland, "
     "Poland. She works from home, so any weekday delivery is fine."),
    ("extraction", "address", "Extract the postal address from this note.",
     "Send the signed contract to our legal team, attention of Daniel Osei, at 220 King Street West, Suite 1100, "
     "Toronto, Ontario M5H 1K4, Canada."),
    ("extraction", "flight_booking", "Extract the booking from this confirmation email.",
     "Your booking Q7XK2M is confirmed. Passengers: Elena Rossi (adult) and Luca Rossi (child). Flight AZ 610 from "
     "Rome Fiumicino (FCO) departs 2025-07-08T10:15 to New York JFK. Cabin: economy. Total paid: 1384.60 EUR."),
    ("extraction", "flight_booking", "Extract the booking from this confirmation email.",
     "Thank you, Mr Hiroshi Tanaka. Reservation code 4HT9ZP. Outbound NH 203 Tokyo Haneda (HND) to Frankfurt (FRA) "
     "on 2025-09-02T11:40; return NH 204 FRA to HND on 2025-09-16T20:05. Business class, 612000 JPY."),
    ("extraction", "calendar_entry", "Create a calendar entry from this email.",
     "Hi Sam, can we do the quarterly budget review on 2025-05-20 from 14:00 to 15:30 in meeting room Atlas? I'll "
     "invite Grace Liu (grace.liu@acme.example) too. Remind me 30 minutes before, please."),
    ("extraction", "movie_review", "Turn this review into a structured record.",
     "Hollow Pines (2019), directed by Marisol Vega, is a slow-burning mystery that rewards patience. The "
     "cinematography is gorgeous and the lead performance is quietly devastating, but the final act leans on coincidence and the "
     "score is often intrusive. 7 out of 10; worth seeing on a big screen."),
    ("extraction", "recipe", "Turn this family recipe into a structured record.",
     "Grandma's lemon cake feeds eight and takes about 20 minutes to put together. Cream 200 g butter with 200 g "
     "sugar, beat in 4 eggs, fold in 200 g flour and the zest of 2 lemons, then bake for 45 minutes at 180 degrees. "
     "Nothing in it is unsuitable for vegetarians. Easy enough for a first-time baker."),
    ("extraction", "product", "Extract the product listing from this shop page.",
     "TrailMate 20L Daypack - SKU TM-20-GRN. Lightweight ripstop nylon pack, 30 x 48 x 18 cm, with a padded laptop "
     "sleeve. Now 59.95 USD, in stock. Rated 4.6 of 5 by hikers. Filed under Outdoors and Bags."),
    # --- tool calls: a request turned into a function call ----------------------------------------------
    ("tool_call", "get_weather_call", "What will the weather be like in Lisbon over the next three days? I prefer "
     "Celsius.", None),
    ("tool_call", "get_weather_call", "Do I need an umbrella in Chicago tomorrow? Give me temperatures in Fahrenheit.",
     None),
    ("tool_call", "send_email_call", "Email jordan@studio.example that the design review moves to Thursday at 10, and "
     "copy alex@studio.example. Mark it high priority.", None),
    ("tool_call", "send_email_call", "Send a short thank-you note to my landlord at r.mehta@homes.example for fixing "
     "the heating so quickly.", None),
    ("tool_call", "search_products_call", "Find me noise-cancelling headphones under 150, best rated first, just the "
     "top 5.", None),
    ("tool_call", "search_products_call", "I'm looking for a beginner's book on woodworking; show the cheapest ones "
     "first.", None),
    ("tool_call", "assistant_action", "Remind me to call the vet on 2025-03-11 at 09:00.", None),
    ("tool_call", "assistant_action", "How much is 250 Swiss francs in euros?", None),
    ("tool_call", "assistant_action", "Look for flights from Madrid (MAD) to Oslo (OSL) on 2025-10-04 for two people.",
     None),
    # --- generation: a record composed from a short brief -----------------------------------------------
    ("generation", "recipe", "Create a recipe for a quick vegan lunch for two people.", None),
    ("generation", "recipe", "Write a recipe for classic buttermilk pancakes.", None),
    ("generation", "product", "Create a shop listing for an insulated stainless-steel water bottle.", None),
    ("generation", "product", "Create a shop listing for a compact wireless keyboard.", None),
    ("generation", "movie_review", "Write a review record for a fictional science-fiction film called 'Orbit of "
     "Glass' (2021).", None),
    ("generation", "movie_review", "Write a review record for a fictional animated family film called 'The Paper "
     "Fox' (2023).", None),
    ("generation", "calendar_entry", "Create a calendar entry for a weekly team stand-up every Monday at 09:15 for 15 "
     "minutes, starting 2025-01-06.", None),
    ("generation", "calendar_entry", "Create a calendar entry for a dentist appointment on 2025-08-19 at 16:00 that "
     "lasts 45 minutes, with a reminder a day before.", None),
    ("generation", "person", "Invent a character for a novel: a retired lighthouse keeper who speaks several "
     "languages.", None),
    ("generation", "event", "Plan a fictional charity 5 km fun run in a city park next spring.", None),
    ("generation", "bug_report", "Write a bug report for this problem: the search box of a note-taking app ignores "
     "accented letters, so 'cafe' does not find 'café'.", None),
    ("generation", "invoice", "Create an invoice from a piano teacher for 3 lessons of one hour at 45 EUR each.",
     None),
]


def prompt_text(schema_name: str, instruction: str, passage: str | None) -> str:
    """The user turn: the instruction (after a tool description for tool calls), the passage, and the schema."""
    text = f"{_TOOLS[schema_name]} {instruction}" if schema_name in _TOOLS else instruction
    if passage:
        text += f"\n\n{passage}"
    return (f"{text}\n\nAnswer with a single JSON value that follows this JSON schema, and nothing else:\n"
            f"{json.dumps(SCHEMAS[schema_name])}")


def rows() -> list[dict[str, Any]]:
    """The prompt set's rows, ids numbered per group (``extraction-01``, ``tool_call-01``, ...)."""
    counts: dict[str, int] = {}
    out = []
    for category, schema_name, instruction, passage in PROMPTS:
        counts[category] = counts.get(category, 0) + 1
        out.append({"id": f"{category}-{counts[category]:02d}", "category": category, "schema_name": schema_name,
                    "prompt": prompt_text(schema_name, instruction, passage), "schema": SCHEMAS[schema_name]})
    return out


def render() -> str:
    """The JSONL file's text."""
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the file differs from what this builds")
    args = parser.parse_args()
    text = render()
    if args.check:
        same = OUT.is_file() and OUT.read_text(encoding="utf-8") == text
        print(f"{OUT}: {'up to date' if same else 'out of date: rerun without --check'}")
        return 0 if same else 1
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {len(PROMPTS)} prompts over {len(SCHEMAS)} schemas to {OUT} ({len(text.encode())} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
