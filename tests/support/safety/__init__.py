"""The safety rules' state machine (tests/recovery/test_safety_properties.py), by concern.

``model`` predicts every answer and state, ``base`` holds the world and reads the facts the
invariants compare, and each step module is one party's moves: ``hosts`` (and approvers),
``workers``, ``provider``, ``operators`` (and the background sweep and lookups).
``machine`` puts them together; the test module adds the rules as invariants.
"""
