"""gdn test helpers, loaded under names of their own (tests/kda has modules of the same file
names): ``gdn_fla_standins`` (fla's stage functions in plain torch, for the CPU chain test)
and ``gdn_chain_cases`` (inputs and the fwd+bwd runner)."""
import family_modules

for _stem in ("fla_standins", "chain_cases"):
    family_modules.load("gdn", _stem)
