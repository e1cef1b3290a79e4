//! `#[derive(KeyPart)]` for unit enums.

use proc_macro2::TokenStream;
use quote::quote;
use syn::{Data, DeriveInput, Fields};

pub fn expand(item: TokenStream) -> TokenStream {
    let input: DeriveInput = match syn::parse2(item) {
        Ok(input) => input,
        Err(err) => return err.to_compile_error(),
    };
    let mut krate: syn::Path = syn::parse_quote!(::toolkey);
    let mut errors = Vec::new();
    for attr in input.attrs.iter().filter(|a| a.path().is_ident("key_part")) {
        let parsed = attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("crate") {
                let lit: syn::LitStr = meta.value()?.parse()?;
                krate = lit.parse()?;
                Ok(())
            } else {
                Err(meta.error("unknown `key_part` key; expected `crate = \"...\"`"))
            }
        });
        if let Err(err) = parsed {
            errors.push(err);
        }
    }
    match &input.data {
        Data::Enum(data) => {
            for variant in &data.variants {
                if !matches!(variant.fields, Fields::Unit) {
                    errors.push(syn::Error::new_spanned(
                        &variant.ident,
                        format!(
                            "variant `{}` carries data, so the enum has no single canonical text form; only unit enums derive `KeyPart`",
                            variant.ident
                        ),
                    ));
                }
            }
        }
        _ => errors.push(syn::Error::new_spanned(
            &input.ident,
            "`KeyPart` can be derived for unit enums only; for a struct, key on its fields instead",
        )),
    }
    if let Some(err) = errors.into_iter().reduce(|mut a, b| {
        a.combine(b);
        a
    }) {
        return err.to_compile_error();
    }
    let ident = &input.ident;
    let (impl_generics, ty_generics, where_clause) = input.generics.split_for_impl();
    quote! {
        impl #impl_generics #krate::KeyPart for #ident #ty_generics #where_clause {
            fn write_key_part(&self, out: &mut #krate::KeyPartWriter<'_>) {
                #krate::__private::write_serde_name(self, out)
            }
        }
    }
}
