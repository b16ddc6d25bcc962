;; enables FEATURE_LANE_EVENTS (1<<7) without FEATURE_COMPLETIONS, which
;; is the only call that carries lane events: the load must fail.
(module
  (memory (export "memory") 1)
  (data (i32.const 1024) "\52\4d\41\57\01\00\00\00\d0\02\00\00\00\00\00\00")
  (func (export "rmaw_abi_v1"))
  (func (export "rmaw_area") (result i32) i32.const 1024)
  (func (export "rmaw_init") (param i64) (result i64) i64.const 128))
