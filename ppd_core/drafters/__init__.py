"""Guess sources as drafters, each with one protocol (``base.Drafter``): ``propose`` adds its candidate nodes to a
step's draft, one ``merge`` makes them the step's tree, ``observe`` learns what the step accepted. The prompt tokens'
tree (``prompt_tokens``), chains copied from the conversation (``lookup``, their lengths from ``chain_policy``) and
text a grammar forces (``forced``); ``registry`` makes an answer's drafters by name."""
