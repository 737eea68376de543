"""Forty extraction and classification prompts, each with its JSON schema (objects, arrays, enums, numbers, nested):
the structured-answer tests' and ``benchmarks/scripts/schema_bench.py``'s."""

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "city": {"type": "string"}}, "required": ["name", "age", "city"]}
SENTIMENT = {"type": "object", "properties": {"sentiment": {"enum": ["positive", "negative", "neutral"]},
                                              "confidence": {"type": "number"}}, "required": ["sentiment", "confidence"]}
ITEMS = {"type": "object", "properties": {"items": {"type": "array", "minItems": 1, "maxItems": 4, "items": {
    "type": "object", "properties": {"name": {"type": "string"}, "quantity": {"type": "integer"}},
    "required": ["name", "quantity"]}}}, "required": ["items"]}
EVENT = {"type": "object", "properties": {"title": {"type": "string"}, "date": {"type": "string"},
                                          "location": {"type": "object", "properties": {
                                              "city": {"type": "string"}, "country": {"type": "string"}},
                                              "required": ["city", "country"]}},
         "required": ["title", "date", "location"]}
TOPIC = {"type": "object", "properties": {"topic": {"enum": ["sports", "politics", "science", "cooking", "music"]},
                                          "keywords": {"type": "array", "items": {"type": "string"}, "maxItems": 3}},
         "required": ["topic", "keywords"]}
BOOK = {"type": "object", "properties": {"title": {"type": "string"}, "author": {"type": "string"},
                                         "year": {"type": "integer"}, "fiction": {"type": "boolean"}},
        "required": ["title", "author", "year", "fiction"]}
PRIORITY = {"type": "object", "properties": {"priority": {"enum": ["low", "medium", "high", "urgent"]},
                                             "team": {"enum": ["billing", "technical", "sales"]},
                                             "summary": {"type": "string"}}, "required": ["priority", "team", "summary"]}
MEASURE = {"type": "object", "properties": {"value": {"type": "number"}, "unit": {"enum": ["kg", "g", "lb", "km", "m"]}},
           "required": ["value", "unit"]}
CONTACT = {"type": "object", "properties": {"email": {"type": "string"}, "phone": {"type": "string"},
                                            "tags": {"type": "array", "items": {"enum": ["work", "family", "friend"]}}},
           "required": ["email", "tags"]}
ANSWER = {"type": "object", "properties": {"answer": {"type": "boolean"}, "reason": {"type": "string"}},
          "required": ["answer", "reason"]}

TEXTS = {
    "PERSON": ["Anna is 31 and lives in Rome.", "My neighbour Tom, aged 45, moved to Oslo.",
               "Li Wei (28) works in Shanghai.", "Maria from Lisbon turned 60 yesterday."],
    "SENTIMENT": ["The soup was cold and the waiter rude.", "Best concert I have ever been to!",
                  "The package arrived on Tuesday.", "I guess the movie was fine, nothing special."],
    "ITEMS": ["Buy two apples, a loaf of bread and six eggs.", "We need 3 chairs and 1 table for the office.",
              "Order ten pencils and four notebooks.", "Pack one tent, two sleeping bags and a stove."],
    "EVENT": ["The jazz festival takes place in Montreal, Canada on 2 July.",
              "Our product launch is on March 3rd in Berlin, Germany.",
              "The marathon will be held in Boston, USA on April 15.",
              "Join the book fair in Frankfurt, Germany, October 14."],
    "TOPIC": ["The team scored twice in the final minutes to win the cup.",
              "Researchers measured the mass of the neutrino with new precision.",
              "Simmer the onions slowly before adding the tomatoes.",
              "The parliament passed the new budget after a long debate."],
    "BOOK": ["Nineteen Eighty-Four by George Orwell came out in 1949.",
             "A Brief History of Time was written by Stephen Hawking in 1988.",
             "Pride and Prejudice, Jane Austen, 1813.", "The Selfish Gene by Richard Dawkins was published in 1976."],
    "PRIORITY": ["I was charged twice this month, please fix it today!", "The app crashes whenever I open settings.",
                 "Can someone send me a quote for 50 licences?", "Minor typo on the pricing page."],
    "MEASURE": ["The parcel weighs 2.5 kilograms.", "The trail is 12 km long.", "Add 250 grams of flour.",
                "The tower is 300 metres tall."],
    "CONTACT": ["Reach Sam at sam@example.com or 555-0101; he is a colleague.",
                "My sister's email is ana@example.org.", "Call my friend Joe: 555-0199, joe@example.net.",
                "Work contact: desk@example.com, phone 555-0000."],
    "ANSWER": ["Is the Pacific the largest ocean?", "Can penguins fly?", "Is 17 a prime number?",
               "Does water boil at 50 degrees Celsius at sea level?"],
}
SCHEMAS = {"PERSON": PERSON, "SENTIMENT": SENTIMENT, "ITEMS": ITEMS, "EVENT": EVENT, "TOPIC": TOPIC, "BOOK": BOOK,
           "PRIORITY": PRIORITY, "MEASURE": MEASURE, "CONTACT": CONTACT, "ANSWER": ANSWER}
INSTRUCTIONS = {"SENTIMENT": "Classify the sentiment as JSON: ", "TOPIC": "Classify the topic as JSON: ",
                "PRIORITY": "Triage this support ticket as JSON: ", "ANSWER": "Answer as JSON: "}

PROMPTS = [(INSTRUCTIONS.get(kind, "Extract as JSON: ") + text, SCHEMAS[kind])
           for kind in TEXTS for text in TEXTS[kind]]
assert len(PROMPTS) == 40
