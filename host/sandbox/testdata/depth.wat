;; plan_op recurses as deep as its size argument, three times in a row, and
;; returns normally (lane 0). $down leaves through `return` at the bottom
;; and by a branch to its own label on the way up, so both exits must give
;; the frame back. A plan_op with peer 7 returns multiple values from a
;; helper (the wrapper block needs a new type).
(module
  (memory (export "memory") 1)
  (data (i32.const 1024) "\52\4d\41\57\01\00\00\00\d0\02\00\00\00\00\00\00")
  (func (export "rmaw_abi_v1"))
  (func (export "rmaw_area") (result i32) i32.const 1024)
  (func (export "rmaw_init") (param i64) (result i64) i64.const 1)
  (func $down (param i32) (result i32)
    (if (i32.eqz (local.get 0)) (then (return (i32.const 0))))
    (call $down (i32.sub (local.get 0) (i32.const 1)))
    (br 0))
  (func $pair (param i32) (result i32 i32)
    (if (local.get 0) (then (return (i32.const 1) (i32.const 2))))
    (i32.const 3) (i32.const 4))
  (func (export "rmaw_plan_op") (param i32 i32 i32 i64 i32 i32) (result i32)
    (if (i32.eq (local.get 2) (i32.const 7))
      (then (return (i32.sub (call $pair (i32.const 1)) (i32.const 1)))))
    (drop (call $down (i32.wrap_i64 (local.get 3))))
    (drop (call $down (i32.wrap_i64 (local.get 3))))
    (drop (call $down (i32.wrap_i64 (local.get 3))))
    (i32.store (i32.const 1040) (i32.const 0))
    i32.const 0)
)
