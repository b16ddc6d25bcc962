;; plan_op traps according to its size argument: 1 unreachable, 2 out of
;; bounds, 3 stack overflow (unbounded recursion), 4 infinite loop,
;; 5 status 99 (nonsense), 6 lane 1000 (nonsense); else lane 0.
(module
  (memory (export "memory") 1)
  (data (i32.const 1024) "\52\4d\41\57\01\00\00\00\d0\02\00\00\00\00\00\00")
  (func (export "rmaw_abi_v1"))
  (func (export "rmaw_area") (result i32) i32.const 1024)
  (func (export "rmaw_init") (param i64) (result i64) i64.const 1)
  (func $rec (param i32) (result i32)
    (i32.add (call $rec (i32.add (local.get 0) (i32.const 1))) (i32.const 1)))
  (func (export "rmaw_plan_op") (param i32 i32 i32 i64 i32 i32) (result i32)
    (if (i64.eq (local.get 3) (i64.const 1)) (then unreachable))
    (if (i64.eq (local.get 3) (i64.const 2)) (then (return (i32.load (i32.const 0xfffffff0)))))
    (if (i64.eq (local.get 3) (i64.const 3)) (then (return (call $rec (i32.const 0)))))
    (if (i64.eq (local.get 3) (i64.const 4)) (then (loop $l (br $l))))
    (if (i64.eq (local.get 3) (i64.const 5)) (then (return (i32.const 99))))
    (if (i64.eq (local.get 3) (i64.const 6)) (then (i32.store (i32.const 1040) (i32.const 1000)) (return (i32.const 0))))
    (i32.store (i32.const 1040) (i32.const 0))
    i32.const 0)
)
