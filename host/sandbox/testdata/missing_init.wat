(module
  (memory (export "memory") 1)
  (func (export "rmaw_abi_v1"))
  (func (export "rmaw_area") (result i32) i32.const 1024))
