"""The conformance suite: Hypothesis properties that check any implementation of the
contract ops."""
