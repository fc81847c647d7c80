"""Small HCL samples for the formatter-check tests (as `terraform fmt` would and would not write them)."""

ALIGNED = '''resource "aws_s3_bucket" "b" {
  bucket        = "x"
  force_destroy = false
  tags          = { Name = "x=y", Path = "${join("=", ["a", "b"])}" }

  lifecycle {
    prevent_destroy = true
  }
}
'''

MISALIGNED = '''resource "aws_s3_bucket" "b" {
  bucket        = "x"
  force_destroy  = false
}
'''

# A value that opens a bracket on its line ends the alignment group, as in hclwrite.
MULTILINE_BREAKS_CHAIN = '''locals {
  a = 1
  long_name = merge(var.tags, {
    Name = "x"
  })
  bb = [
    "x",
  ]
  c = var.a == 1 ? "y" : "z"
}
'''

HEREDOC = '''locals {
  script = <<-EOT
      anything   = goes here
    {  not checked
  EOT
}
'''

WRONG_INDENT = '''resource "x" "y" {
  a = 1
    nested_b {}
  nested {
    c = 3

   d = 4
  }
}
'''
